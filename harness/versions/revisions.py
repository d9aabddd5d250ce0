"""What a REV names, checked before anything is built: a released version (`diffusers==0.38.0` or `0.38.0`), a local
diffusers checkout (`~/diffusers`: its working tree), a git ref in one (`~/diffusers@my-branch`), or `installed` (the
diffusers of this environment). Bad input is one clear line (a HarnessError).

A checkout is identified by the git tree of its source, never by its path: a ref by the tree of its commit, the
working tree by the tree of a snapshot commit (`git stash create`: tracked files as they are now, staged or not;
untracked files are not part of it). The snapshot writes only loose objects into the repository; its working tree,
index, HEAD, refs and stash are left as they were.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import HarnessError

MIN_DIFFUSERS = "0.36.0"  # harness.core.compat.MIN_DIFFUSERS (not imported: that module is for the installed package)
_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?([abc]|rc|\.dev|\.post)?\d*$")
_PACKAGE = "src/diffusers/__init__.py"  # where diffusers' repository keeps the package


@dataclass(frozen=True)
class Revision:
    """One side of `ab`, or one end of a `bisect`. `source` is release, checkout or installed."""

    text: str
    source: str
    version: str | None = None  # release
    repo: Path | None = None  # checkout: the repository's top folder
    ref: str | None = None  # checkout: the ref given (None: the working tree)
    commit: str | None = None  # checkout: the commit the source is taken from (a snapshot for a dirty tree)
    tree: str | None = None  # checkout: the git tree of that source (what the environment is keyed by)
    dirty: bool = False  # checkout: the working tree had changes to tracked files

    @property
    def label(self) -> str:
        """How reports name it: `diffusers 0.38.0`, `diffusers@1a2b3c4d (my-branch)`, `installed`."""
        if self.source == "release":
            return f"diffusers {self.version}"
        if self.source == "installed":
            return f"installed (diffusers {installed_version()})"
        if self.ref == self.commit:  # a bisect step names its commit only
            return f"diffusers@{self.commit[:10]}"
        what = self.ref or ("working tree, uncommitted changes" if self.dirty else "working tree")
        return f"diffusers@{self.commit[:10]} ({what})"

    @property
    def slug(self) -> str:
        """A folder name for its environment: `diffusers-0.38.0`, `git-1a2b3c4d`."""
        return f"diffusers-{self.version}" if self.source == "release" else f"git-{(self.tree or 'x')[:10]}"

    def key_material(self) -> dict:
        """What the diffusers of its environment is made from (never where it came from)."""
        if self.source == "release":
            return {"diffusers": f"diffusers=={self.version}"}
        if self.source == "checkout":
            return {"diffusers_tree": self.tree}
        return {"installed": installed_fingerprint()}


def parse_revision(text: str) -> Revision:
    """The REV `text` names, validated: the version is released, the folder is a diffusers checkout, the ref exists."""
    text = text.strip()
    if text == "installed":
        return Revision(text, "installed")
    version = text.removeprefix("diffusers==")
    if version != text or (_VERSION.match(text) and not Path(text).exists()):
        return _release(text, version)
    path, _, ref = text.rpartition("@") if "@" in text and not Path(text).expanduser().exists() else (text, "", "")
    return checkout(Path(path).expanduser(), ref or None, text)


def _release(text: str, version: str) -> Revision:
    from packaging.version import InvalidVersion, Version

    try:
        parsed = Version(version)
    except InvalidVersion:
        raise HarnessError(f"revision {text!r}: {version!r} is not a version (e.g. diffusers==0.38.0)") from None
    if parsed < Version(MIN_DIFFUSERS):
        raise HarnessError(f"revision {text!r}: the harness needs diffusers >= {MIN_DIFFUSERS}, the first release "
                           "with context parallelism")
    known = released_versions()
    if known is not None and version not in known:
        near = ", ".join(v for v in known if Version(v) >= Version(MIN_DIFFUSERS))
        raise HarnessError(f"revision {text!r}: diffusers {version} is not a released version; released from "
                           f"{MIN_DIFFUSERS}: {near}")
    return Revision(text, "release", version=version)


@functools.cache
def released_versions() -> tuple[str, ...] | None:
    """Every released diffusers version, oldest first, as the package index lists them (`pip index versions`);
    None when the index cannot be asked (then a wrong version is pip's own error at build time)."""
    from packaging.version import Version

    try:
        done = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "diffusers"], capture_output=True,
                              text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = next((line for line in done.stdout.splitlines() if line.startswith("Available versions:")), None)
    if done.returncode != 0 or line is None:
        return None
    versions = [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
    return tuple(sorted(versions, key=Version))


def checkout(path: Path, ref: str | None, text: str | None = None) -> Revision:
    """A diffusers checkout at `ref` (None: its working tree as it is now)."""
    text = text or (f"{path}@{ref}" if ref else str(path))
    if not path.is_dir():
        raise HarnessError(f"revision {text!r}: {path} is not a folder (a diffusers checkout, or a released version "
                           "such as diffusers==0.38.0)")
    top = git(path, "rev-parse", "--show-toplevel", fail=f"{path} is not a diffusers checkout: not a git repository")
    repo = Path(top)
    if ref is not None:
        commit = git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}",
                     fail=f"no commit or ref {ref!r} in {repo}")
        dirty = False
    else:
        head = git(repo, "rev-parse", "--verify", "--quiet", "HEAD^{commit}", fail=f"{repo} has no commit yet")
        # a commit object needs an identity, which a machine may not have configured: the snapshot's is a placeholder
        snapshot = git(repo, "-c", "user.name=harness", "-c", "user.email=harness@localhost", "stash", "create",
                       fail=f"cannot snapshot the working tree of {repo}")
        commit, dirty = (snapshot or head), bool(snapshot)
    if subprocess.run(["git", "-C", str(repo), "cat-file", "-e", f"{commit}:{_PACKAGE}"],
                      capture_output=True).returncode != 0:
        where = ref or "its working tree"
        raise HarnessError(f"revision {text!r}: {repo} is not a diffusers checkout ({where} has no {_PACKAGE})")
    tree = git(repo, "rev-parse", f"{commit}^{{tree}}", fail=f"cannot read the tree of {commit}")
    return Revision(text, "checkout", repo=repo, ref=ref, commit=commit, tree=tree, dirty=dirty)


def git(repo: Path, *args: str, fail: str) -> str:
    """git's output, stripped; a HarnessError with `fail` and git's own first line when git refuses."""
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise HarnessError(f"{fail} ({error})") from None
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [""])[0]
        raise HarnessError(f"{fail}" + (f" (git: {said})" if said else ""))
    return done.stdout.strip()


def installed_version() -> str:
    try:
        return importlib.metadata.version("diffusers")
    except importlib.metadata.PackageNotFoundError:
        raise HarnessError("revision 'installed': diffusers is not installed here") from None


def installed_fingerprint() -> str:
    """The installed diffusers as it is now: its version, where it lives and every source file's size and mtime (an
    editable install changes under its version)."""
    spec = importlib.util.find_spec("diffusers")  # finds the package without importing it
    folder = Path(spec.origin).resolve().parent
    digest = hashlib.sha256(f"{installed_version()} {folder}".encode())
    for path in sorted(folder.rglob("*.py")):
        stat = path.stat()
        digest.update(f"{path.relative_to(folder)} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]
