"""Attention backends: names and capabilities read from diffusers' registry, a real probe, and dispatch counting."""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections import Counter
from dataclasses import dataclass

import torch

from harness.core.backend_names import EVERY_DEVICE
from harness.core.errors import first_line


def registry():
    from harness.core import compat

    compat.check_supported()  # every use of diffusers' attention API passes here first: fail clearly on too old
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    return _AttentionBackendRegistry


def all_backend_names() -> list[str]:
    from harness.core import compat

    compat.check_supported()
    from diffusers.models.attention_dispatch import AttentionBackendName

    return [member.value for member in AttentionBackendName]


def supports_context_parallel(name: str) -> bool:
    """diffusers' own declaration, the one `enable_parallelism` checks."""
    return name in registry()._supports_context_parallel


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def unavailable_reason(name: str, dtype: str = "bf16", device_type: str | None = None) -> str | None:
    """None when the backend runs here in `dtype`; otherwise why not (a broken backend's error included)."""
    return probe(name, dtype, device_type).reason


@dataclass(frozen=True)
class Probe:
    """What a tiny real call through diffusers' dispatcher said: usable (no reason), unavailable here (a SKIP), or
    broken (`broken`: a backend that runs on every device raised, which is an ERROR, never a SKIP)."""

    reason: str | None = None
    broken: bool = False


@functools.cache
def probe(name: str, dtype: str = "bf16", device_type: str | None = None) -> Probe:
    """Cached per process: the probe costs milliseconds, but a plan asks once per case."""
    from diffusers.models.attention_dispatch import (
        AttentionBackendName,
        _check_attention_backend_requirements,
        dispatch_attention_fn,
    )

    from harness.core.dtypes import torch_dtype

    device = torch.device(device_type) if device_type else default_device()
    try:
        backend = AttentionBackendName(name)
    except ValueError:
        return Probe(f"not an attention backend of this diffusers: {name}")
    try:
        _check_attention_backend_requirements(backend)
    except RuntimeError as error:  # a package missing or too old: diffusers' own words
        return Probe(first_line(error))
    query = torch.randn(1, 8, 2, 16, device=device)
    try:
        with warnings.catch_warnings(), quiet_dispatch():
            warnings.simplefilter("ignore")
            dispatch_attention_fn(*(query.to(torch_dtype(dtype)),) * 3, backend=backend)
    except Exception as error:  # noqa: BLE001 - each failure is reported, as a SKIP or as a broken backend
        if name in EVERY_DEVICE:
            return Probe(f"the {name} backend's probe failed ({dtype}, {device.type}): {first_line(error)}", True)
        prefix = "needs CUDA: " if device.type != "cuda" else ""
        return Probe(prefix + first_line(error))
    return Probe()


@functools.cache
def backward_missing(name: str, layout, dtype: str = "fp32") -> str | None:
    """Why the backend `name` cannot train under `layout`, or None. On one device its backward is PyTorch's: a tiny
    call is differentiated (flex attention has none on CPU). Under context parallelism the backward is diffusers'
    own: the backend's `*_backward_op` (found among the names its registered function calls) and, for the *any
    layouts, the templated autograd function's `backward`. Each is called with nothing: one that is not implemented
    raises NotImplementedError before it looks at its arguments."""
    import inspect

    from diffusers.models import attention_dispatch as dispatch

    from harness.core.dtypes import torch_dtype

    query = torch.randn(1, 8, 2, 16, device=default_device(), dtype=torch_dtype(dtype), requires_grad=True)
    try:
        with warnings.catch_warnings(), quiet_dispatch():
            warnings.simplefilter("ignore")
            dispatch.dispatch_attention_fn(query, query, query, backend=dispatch.AttentionBackendName(name)) \
                .float().sum().backward()
    except Exception as error:  # noqa: BLE001 - the reason is the SKIP's
        return f"{name} attention has no backward here ({default_device().type}, {dtype}): {first_line(error)}"
    if not layout.is_context_parallel:
        return None
    function = inspect.unwrap(registry()._backends.get(_backend_key(name), lambda: None))
    called = function.__code__.co_names if hasattr(function, "__code__") else ()
    ops = [op for op in called if op.endswith("_backward_op")]
    for op in ops:
        message = _not_implemented(getattr(dispatch, op, None))
        if message is not None:
            return f"diffusers' {name} attention has no backward ({op}: {message})"
    templated = [cls for degree, cls in ((layout.ulysses, "TemplatedUlyssesAnythingAttention"),
                                         (layout.ring, "TemplatedRingAnythingAttention"))
                 if layout.anything and degree > 1]
    for cls in templated:
        message = _not_implemented(getattr(getattr(dispatch, cls, None), "backward", None))
        if message is not None:
            return f"the {layout.name} layout has no backward in diffusers ({cls}.backward: {message})"
    return None


def _backend_key(name: str):
    from diffusers.models.attention_dispatch import AttentionBackendName

    return AttentionBackendName(name)


def _not_implemented(function) -> str | None:
    if function is None:
        return None
    try:
        function(None, None)
    except NotImplementedError as error:
        return str(error) or "NotImplementedError"
    except Exception:  # noqa: BLE001 - it got past the point where an unimplemented one raises
        return None
    return None


@contextlib.contextmanager
def quiet_dispatch():
    """Probe calls must not count as dispatches of the case under test."""
    saved, ran = dict(_counters), dict(_functions)
    try:
        yield
    finally:
        _counters.clear()
        _counters.update(saved)
        _functions.clear()
        _functions.update(ran)


# --- dispatch counting: which registered backend function actually ran, and how often -------------------------------

_counters: Counter = Counter()  # by the registry name a call went through
_functions: Counter = Counter()  # by the identity (module.qualname) of the function that actually ran


def identity(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def install_dispatch_counters() -> None:
    """Wrap every registered backend function once per process, so every call through diffusers is counted, by
    name and by the function that ran (the wrapper keeps the function's identity)."""
    backends = registry()._backends
    for name, fn in list(backends.items()):
        if getattr(fn, "_harness_counted", False):
            continue
        backends[name] = _counted(getattr(name, "value", name), fn)


def _count(name: str, ran: str) -> None:
    _counters[name] += 1
    _functions[ran] += 1


_tally = torch.zeros(1)  # what harness::dispatched says it mutates (so that no compiler drops the call)


def _count_op():
    """`harness::dispatched(tally, name, ran)`: the count as an op of the compiled graph itself, run each time the
    graph runs. Traced code may not touch the counter (Dynamo guards on what it reads, and recompiles when the count
    moves); an op that mutates an input is kept (functionalized, then run) by aot_eager and Inductor alike, and a
    frame Dynamo split at a graph break keeps it in whichever graph holds the call. (An op registered with an effect
    instead made Inductor free buffers a fused kernel still read: regional compilation of tiny Flux failed.)"""
    if not hasattr(torch.ops.harness, "dispatched"):
        @torch.library.custom_op("harness::dispatched", mutates_args=("tally",))
        def dispatched(tally: torch.Tensor, name: str, ran: str) -> None:
            _count(name, ran)
            tally.add_(1)

        dispatched.register_fake(lambda tally, name, ran: None)
    return torch.ops.harness.dispatched


def _counted(name: str, fn):
    ran, counted = identity(fn), _count_op()

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if torch.compiler.is_compiling():
            counted(_tally, name, ran)
        else:
            _count(name, ran)
        return fn(*args, **kwargs)

    wrapper._harness_counted = True
    return wrapper


def reset_dispatches() -> None:
    _counters.clear()
    _functions.clear()


def dispatches() -> dict[str, int]:
    return dict(sorted(_counters.items()))


def functions_run() -> dict[str, int]:
    return dict(sorted(_functions.items()))


def registry_held() -> dict[str, str]:
    """{backend name: identity of the function diffusers' registry holds for it}, as it stands now."""
    return {getattr(name, "value", name): identity(fn) for name, fn in registry()._backends.items()}


def registry_problems() -> dict[str, str]:
    """{name: problem} for every registry entry that does not hold the function the catalogue says it must
    (harness.catalogue.backends): a case of such a backend proves nothing by the function that ran."""
    from harness.catalogue import backends as catalogue
    from harness.core.compat import installed_version

    return catalogue.registry_problems(registry_held(), installed_version())


def expected_function(name: str) -> str | None:
    """The function the catalogue says backend `name` must hold in the installed diffusers (None: not catalogued)."""
    from harness.catalogue import backends as catalogue
    from harness.core.compat import installed_version

    return catalogue.expected_function(name, installed_version())


def reset_active_backend() -> None:
    """`set_attention_backend` also sets diffusers' process-global active backend (0.37 on); a later case must not
    inherit it. 0.36 has no setter and its `set_attention_backend` leaves the global alone: set the attribute the
    setter sets."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    from harness.core import compat

    if compat.has("set_active_backend"):
        registry().set_active_backend(AttentionBackendName.NATIVE)
    else:
        registry()._active_backend = AttentionBackendName.NATIVE


def backend_table(dtypes=("fp32", "bf16")) -> list[dict]:
    """Every backend diffusers knows: usable here per dtype (probed), why not, and context-parallel capability."""
    from harness.rank.kernels import EXPECTED

    rows = []
    for name in all_backend_names():
        row = {"backend": name, "context_parallel": supports_context_parallel(name)}
        reasons = {dtype: unavailable_reason(name, dtype) for dtype in dtypes}
        for dtype in dtypes:
            row[dtype] = "usable" if reasons[dtype] is None else "no"
        row["kernels_checked"] = _short_kernels(EXPECTED.get(name))
        row["reason"] = next((reason for reason in reasons.values() if reason), "")
        rows.append(row)
    return rows


def _short_kernels(names) -> str:
    if not names:
        return "-"
    if len(names) > 3:
        return "any SDPA kernel"
    return ", ".join(sorted(n.replace("aten::_scaled_dot_product_", "").replace("_attention", "") for n in names))
