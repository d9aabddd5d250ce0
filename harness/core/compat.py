"""Which diffusers releases the harness runs on, and what each one lacks: the one place that knows.

Context parallelism landed in diffusers 0.36.0, so that is the minimum. Newer parts of the parallel API arrived
release by release; each is probed on the installed package (an attribute, a dataclass field, a signature), never
guessed from the version string, and `FEATURES` only names the release that introduced it for the SKIP reason.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from harness.core.errors import HarnessError

MIN_DIFFUSERS = "0.36.0"  # the first release with ContextParallelConfig and enable_parallelism


@functools.cache
def installed_version() -> str:
    """The installed diffusers version, read from its metadata (no import of diffusers itself)."""
    try:
        return importlib.metadata.version("diffusers")
    except importlib.metadata.PackageNotFoundError:
        raise HarnessError(f"diffusers is not installed; the harness needs diffusers >= {MIN_DIFFUSERS}") from None


def check_supported(version: str | None = None) -> None:
    """A HarnessError naming the installed and the minimum version when diffusers is too old to be tested."""
    version = installed_version() if version is None else version
    try:
        too_old = Version(version) < Version(MIN_DIFFUSERS)
    except InvalidVersion:
        raise HarnessError(f"cannot read the installed diffusers version {version!r}") from None
    if too_old:
        raise HarnessError(f"diffusers {version} is installed; the harness needs diffusers >= {MIN_DIFFUSERS}, the "
                           f"first release with context parallelism (pip install 'diffusers>={MIN_DIFFUSERS}')")


# --- probes: each is True when the installed diffusers has the feature ---------------------------------------------


def _cp_config_fields() -> set[str]:
    from diffusers import ContextParallelConfig

    return {field.name for field in dataclasses.fields(ContextParallelConfig)}


def _has_tensor_parallel() -> bool:
    import diffusers

    return hasattr(diffusers, "TensorParallelConfig") and importlib.util.find_spec(
        "diffusers.hooks.tensor_parallel") is not None


def _has_parallel_config_tp() -> bool:
    from diffusers import ParallelConfig

    return "tensor_parallel_config" in {field.name for field in dataclasses.fields(ParallelConfig)}


def _has_unified_ring_ulysses() -> bool:
    """0.36's ContextParallelConfig refuses ring and Ulysses together ("Unified Ulysses-Ring attention is not yet
    supported"); asked of the config itself, which needs no process group."""
    from diffusers import ContextParallelConfig

    try:
        ContextParallelConfig(ring_degree=2, ulysses_degree=2)
    except (ValueError, NotImplementedError):
        return False
    return True


def _has_native_flash_ops() -> bool:
    from diffusers.models import attention_dispatch

    return all(hasattr(attention_dispatch, f"_native_flash_attention_{part}_op") for part in ("forward", "backward"))


def _has_set_active_backend() -> bool:
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    return hasattr(_AttentionBackendRegistry, "set_active_backend")


def _qwenimage_requires_txt_seq_lens() -> bool:
    """0.36's QwenImage RoPE takes the text length only from `txt_seq_lens`, a required argument; later releases
    read it from the text itself."""
    from diffusers.models.transformers.transformer_qwenimage import QwenEmbedRope

    parameter = inspect.signature(QwenEmbedRope.forward).parameters.get("txt_seq_lens")
    return parameter is not None and parameter.default is inspect.Parameter.empty


@dataclass(frozen=True)
class Feature:
    """A part of diffusers' parallel API that some supported releases lack."""

    what: str  # as a SKIP reason names it
    since: str  # the release that introduced it, for the message only
    probe: Callable[[], bool]


FEATURES: dict[str, Feature] = {
    "tensor_parallel": Feature("tensor parallelism", "0.40", _has_tensor_parallel),
    "parallel_config_tp": Feature("ParallelConfig(tensor_parallel_config=...)", "0.40", _has_parallel_config_tp),
    "ulysses_anything": Feature("ulysses_anything", "0.37", lambda: "ulysses_anything" in _cp_config_fields()),
    "ring_anything": Feature("ring_anything", "0.38", lambda: "ring_anything" in _cp_config_fields()),
    "unified_ring_ulysses": Feature("ring and Ulysses combined (ringRxulyssesU)", "0.37", _has_unified_ring_ulysses),
    "cp_mesh": Feature("ContextParallelConfig(mesh=...)", "0.38", lambda: "mesh" in _cp_config_fields()),
    "native_flash_ops": Feature("_native_flash forward/backward ops", "0.37", _has_native_flash_ops),
    "set_active_backend": Feature("_AttentionBackendRegistry.set_active_backend", "0.37", _has_set_active_backend),
    "qwenimage_txt_seq_lens_optional": Feature("QwenImage without txt_seq_lens", "0.37",
                                               lambda: not _qwenimage_requires_txt_seq_lens()),
}


@functools.cache
def has(name: str) -> bool:
    """Whether the installed diffusers has feature `name` (a key of FEATURES); probed once per process."""
    check_supported()
    try:
        feature = FEATURES[name]
    except KeyError:
        raise HarnessError(f"unknown diffusers feature {name!r}; known: {', '.join(FEATURES)}") from None
    return feature.probe()


def missing(name: str) -> str | None:
    """None when the installed diffusers has the feature, else the SKIP reason, e.g.
    "tensor parallelism needs diffusers >= 0.40 (installed 0.38.0)"."""
    if has(name):
        return None
    feature = FEATURES[name]
    return f"{feature.what} needs diffusers >= {feature.since} (installed {installed_version()})"


def layout_missing(layout) -> str | None:
    """Why the installed diffusers cannot express `layout` at all (None if it can): a plan-time SKIP reason."""
    needs = []
    if layout.tp > 1:
        needs.append("tensor_parallel")
        if layout.is_context_parallel:
            needs.append("parallel_config_tp")
    if layout.ring > 1 and layout.ulysses > 1:
        needs.append("unified_ring_ulysses")
    if layout.anything and layout.ulysses > 1:
        needs.append("ulysses_anything")
    if layout.anything and layout.ring > 1:
        needs.append("ring_anything")
    if layout.dp > 1 and layout.is_context_parallel:  # without `mesh=` diffusers spans the whole world, dp ranks too
        needs.append("cp_mesh")
    return next((reason for reason in map(missing, needs) if reason), None)


def model_class_missing(class_name: str) -> str | None:
    """None when the installed diffusers exports `class_name`, else the SKIP reason."""
    check_supported()
    import diffusers

    if hasattr(diffusers, class_name):
        return None
    return f"diffusers {installed_version()} has no {class_name}"


@functools.cache
def source_of(module: str) -> str:
    """The installed diffusers module's source ("" where the release has no such module): what a release refuses is
    read from its own code (harness.loads.guard, harness.catalogue.refusals)."""
    if importlib.util.find_spec("diffusers") is None or importlib.util.find_spec(module) is None:
        return ""
    return inspect.getsource(importlib.import_module(module))
