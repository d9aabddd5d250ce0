"""The function each attention backend name of diffusers must hold, declared once.

diffusers' `_AttentionBackendRegistry` maps a name to a function at import. A registration mistake (a name mapped to
another backend's function) would make any check against the registry itself pass: the function that ran is the
one the registry holds. So the proof checks the function that ran against this catalogue, and every run checks
the registry against it at plan time (harness.run.plan). Read off diffusers 0.36.0 to 0.42.1
(`@_AttentionBackendRegistry.register(AttentionBackendName.X, ...)` on `def name(...)` in
`diffusers/models/attention_dispatch.py`); a name diffusers renamed carries the releases each spelling has.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version

MODULE = "diffusers.models.attention_dispatch"
WHERE = "harness/catalogue/backends.py"


@dataclass(frozen=True)
class Entry:
    name: str  # the AttentionBackendName value
    function: str  # the qualname of the function in MODULE
    releases: str = ""  # the diffusers releases the name exists in (empty: all since 0.36)

    @property
    def identity(self) -> str:
        return f"{MODULE}.{self.function}"


CATALOGUE = (
    Entry("native", "_native_attention"),
    Entry("_native_math", "_native_math_attention"),
    Entry("_native_flash", "_native_flash_attention"),
    Entry("_native_efficient", "_native_efficient_attention"),
    Entry("_native_cudnn", "_native_cudnn_attention"),
    Entry("_native_npu", "_native_npu_attention"),
    Entry("_native_xla", "_native_xla_attention"),
    Entry("flex", "_native_flex_attention"),
    Entry("flash", "_flash_attention"),
    Entry("flash_hub", "_flash_attention_hub"),
    Entry("flash_varlen", "_flash_varlen_attention"),
    Entry("flash_varlen_hub", "_flash_varlen_attention_hub"),
    Entry("flash_4_hub", "_flash_attention_4_hub", ">=0.38"),
    Entry("_flash_3", "_flash_attention_3"),
    Entry("_flash_3_hub", "_flash_attention_3_hub"),
    Entry("_flash_3_varlen_hub", "_flash_attention_3_varlen_hub"),
    Entry("_flash_varlen_3", "_flash_varlen_attention_3"),
    Entry("aiter", "_aiter_flash_attention", "<0.40"),  # renamed in 0.40
    Entry("aiter_fa2_hub", "_aiter_flash_attention", ">=0.40"),
    Entry("sage", "_sage_attention"),
    Entry("sage_hub", "_sage_attention_hub"),
    Entry("sage_blackwell_hub", "_sage_attention_blackwell_hub", ">=0.41"),
    Entry("sage_varlen", "_sage_varlen_attention"),
    Entry("_sage_qk_int8_pv_fp8_cuda", "_sage_qk_int8_pv_fp8_cuda_attention"),
    Entry("_sage_qk_int8_pv_fp8_cuda_sm90", "_sage_qk_int8_pv_fp8_cuda_sm90_attention"),
    Entry("_sage_qk_int8_pv_fp16_cuda", "_sage_qk_int8_pv_fp16_cuda_attention"),
    Entry("_sage_qk_int8_pv_fp16_triton", "_sage_qk_int8_pv_fp16_triton_attention"),
    Entry("xformers", "_xformers_attention"),
)

# Names that may share one function by design (none in 0.36-0.42.1): {frozenset({name, name})}.
ALIASES: frozenset[frozenset[str]] = frozenset()


def expected_function(name: str, version: str) -> str | None:
    """The identity (module.qualname) the backend `name` must hold in diffusers `version`; None: not catalogued."""
    entry = _entries(version).get(name)
    return entry.identity if entry else None


def registry_problems(held: dict[str, str], version: str) -> dict[str, str]:
    """{name: why its cases cannot be proven} for a registry `held` ({name: identity of the function it holds}):
    a name the catalogue does not know, a name holding another function than the catalogue's, and two names holding
    one function (unless the catalogue says they are aliases)."""
    entries, problems = _entries(version), {}
    for name, identity in held.items():
        entry = entries.get(name)
        if entry is None:
            problems[name] = (f"backend {name!r} (holding {identity}) is not in the harness's catalogue of backend "
                              f"functions: update the catalogue ({WHERE})")
        elif identity != entry.identity:
            problems[name] = (f"diffusers' registry maps backend {name!r} to {identity}, where the catalogue says "
                              f"{entry.identity}: a registration mistake in diffusers, or a rename (then update the "
                              f"catalogue, {WHERE})")
    holders: dict[str, list[str]] = {}
    for name, identity in held.items():
        holders.setdefault(identity, []).append(name)
    for identity, names in holders.items():
        shared = [name for name in names if not any(frozenset({name, other}) in ALIASES for other in names
                                                    if other != name)]
        if len(shared) > 1:
            for name in shared:
                problems.setdefault(name, f"backends {', '.join(sorted(shared))} share one function {identity}: a "
                                          f"case of either cannot prove which backend ran")
    return problems


def _entries(version: str) -> dict[str, Entry]:
    release = Version(version)
    return {entry.name: entry for entry in CATALOGUE
            if not entry.releases or SpecifierSet(entry.releases).contains(release, prereleases=True)}
