"""The reference file: weights, inputs and fp32 output of one model, with self-describing metadata.

One safetensors file per model and shape. Written atomically and never replaced unless asked;
verified (schema, checksum, spec config) on every load.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness import SCHEMA_VERSION
from harness.core.errors import HarnessError

_WEIGHTS, _INPUTS, _OUTPUT, _EXTRAS = "weights.", "inputs.", "output", "extra."
_MODULES = "modules."  # per-module fingerprints (harness.rank.fingerprint), one [modules, width] tensor per part
# A recapture on the platform that made the file reproduces its fingerprints bit for bit; elsewhere its metadata (the
# platform) differs anyway. Within this, a forced recapture keeps the file.
_MODULES_BOUND = 1e-4


def fix_for(path: Path) -> str:
    """The one command that repairs this file: restore it from git where it is committed (a recapture would churn
    a binary), else recapture exactly this model, shape and kind (not every reference)."""
    path = Path(path)
    kind, _, shape = path.stem.partition("@")
    recapture = (f"`harness capture --models {path.parent.name} --kinds {kind} --shapes {shape or 'default'} "
                 f"--force`")
    if _committed(path):
        return f"restore the committed file with `git checkout -- {path}`, or recapture just it with {recapture}"
    return f"recapture just this file with {recapture}"


def _committed(path: Path) -> bool:
    import subprocess

    try:
        done = subprocess.run(["git", "-C", str(path.parent), "ls-files", "--error-unmatch", path.name],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@dataclass
class Reference:
    path: Path
    weights: dict[str, torch.Tensor]
    inputs: dict[str, Any]
    output: torch.Tensor
    meta: dict[str, Any]
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # what a kind keeps besides its output (train)
    # what each module gave in the run that made it: {part: (module names in order, [modules, width] fingerprints)},
    # "forward" and, for a loss, "backward"; empty in a file written before them (harness.rank.fingerprint)
    modules: dict[str, tuple[list[str], torch.Tensor]] = field(default_factory=dict)

    @property
    def modules_about(self) -> dict[str, Any]:
        """How the fingerprints were made: the platform, the rerun noise measured as they were captured."""
        return {key: value for key, value in self.meta.get("modules", {}).items() if key != "names"}


@dataclass
class ModuleRecord:
    """What `write_reference` stores of each module: the parts' names and fingerprints, and how they were made."""

    parts: dict[str, tuple[list[str], torch.Tensor]]
    about: dict[str, Any]


def reference_meta(model: str, shape: str, kind: str, config: dict, config_hash: str, **extra) -> dict[str, Any]:
    """What every reference says of itself: what it is, the single-device fp32 run that made it, and where."""
    from harness.core import environment

    return {"model": model, "shape": shape, "kind": kind, "dtype": "fp32", "layout": "single", "backend": "native",
            "world_size": 1, "config": config, "config_hash": config_hash, **extra, **environment.describe()}


def reference_path(root: Path, model: str, shape: str = "default", kind: str = "tensor") -> Path:
    suffix = "" if shape == "default" else f"@{shape}"
    return Path(root) / model / f"{kind}{suffix}.safetensors"


def checksum(tensors: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for key in sorted(tensors):
        tensor = tensors[key].contiguous()
        digest.update(key.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


# How far two fp32 captures of one reference on one machine may differ (measured: 1.9e-7 on the tiny zoo, from the
# addresses tensors land at); a forced recapture within it keeps the file, so git sees no change.
REPRODUCIBLE = 1e-6


def write_reference(path: Path, weights, inputs, output, meta: dict[str, Any], force: bool = False,
                    extras: dict[str, torch.Tensor] | None = None, loose: dict[str, float] | None = None,
                    modules: ModuleRecord | None = None) -> bool:
    """Write atomically; returns False (and writes nothing) when the file exists and `force` is off, or when the
    new capture is the file's own within REPRODUCIBLE (same weights, inputs, versions; outputs within it; `loose`:
    extras whose names start so reproduce only within a wider bound, the kind's measured one). `modules`: the
    per-module fingerprints, in the same file (one checksum, one atomic write)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not force:
        return False
    tensors = {_WEIGHTS + k: v.detach().contiguous() for k, v in weights.items()}
    static = {}
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor):
            tensors[_INPUTS + key] = value.detach().contiguous()
        else:
            static[key] = _encode(value)
    tensors[_OUTPUT] = output.detach().float().contiguous()
    tensors.update({_EXTRAS + k: v.detach().contiguous() for k, v in (extras or {}).items()})
    if modules is not None:
        tensors.update({_MODULES + part: values.contiguous() for part, (_, values) in modules.parts.items()})
        meta = dict(meta, modules={**modules.about, "names": {part: names for part, (names, _) in
                                                              modules.parts.items() if not part.endswith("_in")}})
    header = dict(meta, schema=SCHEMA_VERSION, static_inputs=static, checksum=checksum(tensors))
    bounds = {_EXTRAS + prefix: bound for prefix, bound in (loose or {}).items()} | {_MODULES: _MODULES_BOUND}
    if path.exists() and recapture_difference(path, tensors, header, bounds) is None:
        return False
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"harness": json.dumps(header, sort_keys=True)})
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        if force:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)  # atomic create-if-absent: a concurrent capture cannot be overwritten
            except FileExistsError:
                return False
        return True
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def recapture_difference(path: Path, tensors: dict[str, torch.Tensor], header: dict,
                         bounds: dict[str, float] | None = None) -> str | None:
    """Why a new capture is not the file's own (None when it is): another schema, versions or config, other weights
    or inputs (bit for bit), or an output or extra further than REPRODUCIBLE."""
    from safetensors import safe_open

    try:
        old_header = read_meta(path)
        with safe_open(str(path), framework="pt") as handle:
            old = {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as error:  # noqa: BLE001 - an unreadable old file is simply replaced
        return f"the old file cannot be read ({error})"
    volatile = {"checksum"}
    changed = sorted(key for key in set(header) | set(old_header) if key not in volatile
                     and header.get(key) != old_header.get(key))
    if changed:
        return f"its metadata differs ({', '.join(changed)})"
    if set(old) != set(tensors):
        return "it holds other tensors"
    for key, new in tensors.items():
        exact = key.startswith((_WEIGHTS, _INPUTS)) or not new.is_floating_point()
        bound = next((value for prefix, value in (bounds or {}).items() if key.startswith(prefix)), REPRODUCIBLE)
        if not (torch.equal(new, old[key]) if exact else _within(new, old[key], bound)):
            return f"{key} differs{' (it must be bit for bit)' if exact else f' by more than {bound:g}'}"
    return None


def _within(new: torch.Tensor, old: torch.Tensor, bound: float) -> bool:
    if new.shape != old.shape:
        return False
    return not new.numel() or float((new.double() - old.double()).abs().max()) <= bound


def read_meta(path: Path) -> dict[str, Any]:
    from safetensors import safe_open

    path = Path(path)
    if not path.exists():
        raise HarnessError(f"missing reference {path}: run `harness capture` or `pytest --ref` to create it")
    try:
        with safe_open(str(path), framework="pt") as handle:
            header = (handle.metadata() or {}).get("harness")
    except Exception as error:  # noqa: BLE001 - safetensors raises several types for damaged files
        raise HarnessError(f"reference {path} is unreadable ({error}); {fix_for(path)}") from None
    if header is None:
        raise HarnessError(f"{path} is not a harness reference (no 'harness' metadata); {fix_for(path)}")
    try:
        meta = json.loads(header)
    except json.JSONDecodeError:
        meta = None
    if not isinstance(meta, dict):
        raise HarnessError(f"reference {path} has damaged metadata (not a JSON object); {fix_for(path)}")
    if meta.get("schema", 0) > SCHEMA_VERSION:
        raise HarnessError(
            f"reference {path} has schema {meta.get('schema')}, newer than this harness ({SCHEMA_VERSION}); "
            "upgrade the harness or recapture with this one"
        )
    return meta


def read_reference(path: Path, expected_config_hash: str | None = None) -> Reference:
    from safetensors.torch import load_file

    path = Path(path)
    meta = read_meta(path)
    try:
        tensors = load_file(str(path))
    except Exception as error:  # noqa: BLE001
        raise HarnessError(f"reference {path} is unreadable ({error}); {fix_for(path)}") from None
    if checksum(tensors) != meta.get("checksum"):
        raise HarnessError(f"reference {path} failed its checksum (corrupted or edited); {fix_for(path)}")
    if expected_config_hash and meta.get("config_hash") != expected_config_hash:
        raise HarnessError(
            f"reference {path} was captured from another config of {meta.get('model')!r} "
            f"({meta.get('config_hash')} != {expected_config_hash}); {fix_for(path)}"
        )
    weights = {k[len(_WEIGHTS):]: v for k, v in tensors.items() if k.startswith(_WEIGHTS)}
    inputs: dict[str, Any] = {k[len(_INPUTS):]: v for k, v in tensors.items() if k.startswith(_INPUTS)}
    inputs.update({key: _decode(value) for key, value in meta.get("static_inputs", {}).items()})
    extras = {k[len(_EXTRAS):]: v for k, v in tensors.items() if k.startswith(_EXTRAS)}
    return Reference(path, weights, inputs, tensors[_OUTPUT], meta, extras, _modules(path, tensors, meta))


def _modules(path: Path, tensors: dict[str, torch.Tensor], meta: dict) -> dict[str, tuple[list[str], torch.Tensor]]:
    """The per-module fingerprints, each part's names from the header beside its tensor (an `_in` part, the same
    modules' inputs, has its part's; a count that does not match is a damaged file); none in a file written before
    them."""
    names = meta.get("modules", {}).get("names", {})
    found = {}
    for key in (key for key in tensors if key.startswith(_MODULES)):
        part = key[len(_MODULES):]
        named = names.get(part.removesuffix("_in"))
        if not isinstance(named, list) or len(named) != tensors[key].shape[0]:
            raise HarnessError(f"reference {path} has damaged module fingerprints ({part}: the names and values "
                               f"do not match); {fix_for(path)}")
        found[part] = (named, tensors[key])
    return found


def _encode(value):
    """JSON keeps lists but not tuples; models such as QwenImage care (`img_shapes`), so tag them."""
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(item) for item in value]}
    if isinstance(value, list):
        return [_encode(item) for item in value]
    return value


def _decode(value):
    if isinstance(value, dict) and set(value) == {"__tuple__"}:
        return tuple(_decode(item) for item in value["__tuple__"])
    if isinstance(value, list):
        return [_decode(item) for item in value]
    return value
