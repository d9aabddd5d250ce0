"""A git repository of diffusers' released sources, one commit per release (tag `v<version>`), each the `diffusers/`
package of the published wheel unpacked into `src/diffusers` with a pyproject that installs it with the wheel's own
requirements. It stands in for a clone of diffusers (which cannot be fetched here) for `harness bisect` over git.

Built once into the environment cache (`<cache>/test-repos/diffusers-releases`) and reused while it holds every tag
asked for; the wheels come through pip (its cache keeps them). Commit ids differ between builds, the trees do not, and
environments are keyed by tree: a rebuilt repository reuses the environments of the last one.
"""

from __future__ import annotations

import email.parser
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PYPROJECT = """[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "diffusers"
version = "{version}"
requires-python = ">=3.8"
dependencies = {dependencies}

[tool.setuptools.packages.find]
where = ["src"]

[tool.setuptools.package-data]
"*" = ["*"]
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def releases_repo(folder: Path, versions: list[str]) -> Path:
    """The repository at `folder`, built (or completed) so that it has a commit per version, oldest first."""
    if not (folder / ".git").exists():
        folder.mkdir(parents=True, exist_ok=True)
        git(folder, "init", "-q", "-b", "main")
        git(folder, "config", "user.email", "releases@example.com")
        git(folder, "config", "user.name", "releases")
    tags = set(git(folder, "tag").split())
    present = [version for version in versions if f"v{version}" in tags]
    if present != versions[:len(present)] or len(present) != len(tags):  # only a missing tail can be added
        raise RuntimeError(f"{folder} holds other releases ({sorted(tags)}); remove it to rebuild")
    with tempfile.TemporaryDirectory() as wheels:
        for version in versions:
            if f"v{version}" not in tags:
                _commit_release(folder, version, Path(wheels))
    return folder


def _commit_release(repo: Path, version: str, wheels: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d",
                    str(wheels), f"diffusers=={version}"], check=True, capture_output=True)
    wheel = next(wheels.glob(f"diffusers-{version}-*.whl"))
    package = repo / "src" / "diffusers"
    if package.exists():
        git(repo, "rm", "-r", "-q", "src/diffusers")
    with zipfile.ZipFile(wheel) as archive:
        members = [name for name in archive.namelist() if name.startswith("diffusers/")]
        archive.extractall(repo / "src", members)
        metadata = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        requires = email.parser.Parser().parsestr(archive.read(metadata).decode()).get_all("Requires-Dist") or []
    dependencies = [item for item in requires if "extra ==" not in item]
    (repo / "pyproject.toml").write_text(PYPROJECT.format(version=version, dependencies=json.dumps(dependencies)))
    (repo / ".gitignore").write_text("build/\n*.egg-info/\n__pycache__/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"diffusers {version} (its wheel's sources)")
    git(repo, "tag", f"v{version}")
