"""Per-module fingerprints: what each module of a one-device run gave, small enough to store beside a reference, and
enough to tell where a later run first left it.

A module's output is reduced to `PROJECTIONS` fixed random projections (a seeded Gaussian basis over its flattened
values, scaled by 1/sqrt(n): each projection is of the size of the output's RMS), its RMS and its largest magnitude,
in float64. Two outputs that differ anywhere differ in the projections (by about the RMS of their difference); two
bitwise equal outputs give the same fingerprint up to the float64 arithmetic of the projection itself
(`RESOLUTION`). A run records, in the order the modules finish, every module's output (`forward`) and, for a
differentiable loss (train), what each module's backward hands on at step 1 (`backward`); the whole output last
(`OUTPUT`), so that what moves after the last module (a pipeline's VAE) is seen too.
"""

from __future__ import annotations

import math
import platform as _platform
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from harness.rank.localize import first_tensor  # a module's output as one tensor, as localization reads it

PROJECTIONS = 4
WIDTH = PROJECTIONS + 2  # the projections, the RMS, the largest magnitude
SEED = 59
OUTPUT = "(output)"  # the run's whole output, after the last module
# Below this relative difference two fingerprints are the same output: the float64 projection of bitwise equal fp32
# values varies with where they lie in memory by ~1e-16 per term; one fp32 ulp of one value among 10^6 is ~1e-13.
RESOLUTION = 1e-14
_BASES: dict[int, torch.Tensor] = {}


def fingerprint(tensor: torch.Tensor) -> torch.Tensor:
    """The float64 fingerprint of one tensor (`WIDTH` values)."""
    if hasattr(tensor, "to_local"):  # a DTensor: this rank's piece
        tensor = tensor.to_local()
    if tensor.is_complex():  # a rotary embedding's
        tensor = torch.view_as_real(tensor)
    flat = tensor.detach().reshape(-1).to("cpu", torch.float64)
    count = flat.numel()
    if count == 0:
        return torch.zeros(WIDTH, dtype=torch.float64)
    projections = (_basis(count) * flat).sum(dim=1)
    rms = flat.square().mean().sqrt()
    return torch.cat([projections, rms.reshape(1), flat.abs().max().reshape(1)])


def _basis(count: int) -> torch.Tensor:
    """The fixed Gaussian basis for outputs of `count` values, drawn on the CPU from `SEED` (the same everywhere)."""
    if count not in _BASES:
        generator = torch.Generator().manual_seed(SEED)
        _BASES[count] = torch.randn(PROJECTIONS, count, generator=generator, dtype=torch.float64) / math.sqrt(count)
    return _BASES[count]


def difference(new: torch.Tensor, old: torch.Tensor) -> float:
    """How far two fingerprints are apart, relative to the output's size: the largest difference of a projection or
    of the RMS over the larger RMS, and of the largest magnitude over the larger one. About the relative RMS
    difference of the two outputs; 0 for bitwise equal ones (up to `RESOLUTION`); inf where only one is finite."""
    if not (torch.isfinite(new).all() and torch.isfinite(old).all()):
        return 0.0 if torch.equal(new.isnan(), old.isnan()) and torch.equal(new.nan_to_num(), old.nan_to_num()) \
            else math.inf
    scale = max(float(new[PROJECTIONS]), float(old[PROJECTIONS]), 1e-30)
    peak = max(float(new[-1].abs()), float(old[-1].abs()), 1e-30)
    spread = float((new[:PROJECTIONS + 1] - old[:PROJECTIONS + 1]).abs().max()) / scale
    return max(spread, float((new[-1] - old[-1]).abs()) / peak)


PARTS = ("forward", "forward_in", "backward", "backward_in")  # a module's output and input; in backward, what its
# backward hands on (its "output") and what it receives


@dataclass
class Fingerprints:
    """One run's fingerprints: per part, the module names in the order they finished and their fingerprints (the
    `_in` parts: the same modules' inputs, zeros where a module was given no tensor)."""

    names: dict[str, list[str]] = field(default_factory=lambda: {part: [] for part in PARTS})
    values: dict[str, list[torch.Tensor]] = field(default_factory=lambda: {part: [] for part in PARTS})

    def add(self, part: str, name: str, output: torch.Tensor, given: torch.Tensor | None) -> None:
        for side, tensor in ((part, output), (part + "_in", given)):
            self.names[side].append(name)
            self.values[side].append(torch.zeros(WIDTH, dtype=torch.float64) if tensor is None
                                     else fingerprint(tensor))

    def parts(self) -> dict[str, tuple[list[str], torch.Tensor]]:
        """{part: (names, [modules, WIDTH] values)} of the parts recorded (a run without a loss has no backward)."""
        return {part: (self.names[part], torch.stack(self.values[part])) for part in PARTS if self.names[part]}


def whole(output) -> torch.Tensor | None:
    """A run's whole output as one tensor: the first tensor in it, or a picture (an array)."""
    tensor = first_tensor(output)
    if tensor is None and hasattr(output, "__array__"):
        import numpy as np

        tensor = torch.from_numpy(np.asarray(output))
    return tensor


class Recorder:
    """Fingerprints every module of `module` while it is entered (a context manager): each module's output and input
    as it finishes and, with `backward`, what each module's backward hands on and receives. `finish(output)` adds the
    run's whole output and returns the fingerprints. Under a layout each rank records its own pieces."""

    def __init__(self, module: torch.nn.Module, backward: bool = False):
        self.module, self.backward, self.found, self.handles = module, backward, Fingerprints(), []
        self.calls: Counter = Counter()

    def __enter__(self) -> Recorder:
        # a module whose inputs need no gradient: its full backward hook sees its output's (torch says so, once each)
        self.quiet = warnings.catch_warnings()
        self.quiet.__enter__()
        warnings.filterwarnings("ignore", "Full backward hook is firing", UserWarning)
        for name, submodule in self.module.named_modules():
            if name:
                self.handles.append(submodule.register_forward_hook(self._forward_hook(name), with_kwargs=True))
                if self.backward:
                    self.handles.append(submodule.register_full_backward_hook(self._backward_hook(name)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        self.quiet.__exit__(*exc)

    def finish(self, output) -> Fingerprints:
        tensor = whole(output)
        if tensor is not None:
            self.found.add("forward", OUTPUT, tensor, None)
        return self.found

    def _named(self, part: str, name: str) -> str:
        self.calls[part, name] += 1
        return name if self.calls[part, name] == 1 else f"{name}#{self.calls[part, name]}"

    def _forward_hook(self, name: str):
        def hook(_module, args, kwargs, output):
            tensor = first_tensor(output)
            if tensor is not None:
                given = first_tensor(list(args) + list(kwargs.values()))
                self.found.add("forward", self._named("forward", name), tensor, given)
        return hook

    def _backward_hook(self, name: str):
        def hook(_module, grad_input, grad_output):
            given = first_tensor(list(grad_input))
            if given is not None:
                self.found.add("backward", self._named("backward", name), given, first_tensor(list(grad_output)))
        return hook


def record(module: torch.nn.Module, run: Callable[[], object], loss: Callable[[], torch.Tensor] | None = None
           ) -> tuple[Fingerprints, object]:
    """The fingerprints of one run of `run` (or, with `loss`, of step 1's loss and its backward) and what it
    returned, its `whole` output last (`OUTPUT`)."""
    recorder = Recorder(module, backward=loss is not None)
    try:
        with recorder:
            if loss is None:
                with torch.no_grad():
                    output = run()
            else:
                output = loss()
                output.backward()
                output = output.detach()
    finally:
        if loss is not None:
            module.zero_grad(set_to_none=True)
    return recorder.finish(output), output


def platform() -> dict[str, str]:
    """What decides whether a one-device fp32 run reproduces bit for bit: torch's build, the device, and on a CPU
    the vector instructions torch dispatches to, the processor model and the threads it sums over (a capture runs on
    a rank's: harness.core.determinism.as_a_rank_computes)."""
    found = {"torch": torch.__version__}
    if torch.cuda.is_available():
        found["device"] = torch.cuda.get_device_name(0)
        return found
    found["device"] = f"cpu {_platform.machine()}"
    found["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    found["cpu_model"] = _cpu_model()
    found["threads"] = str(torch.get_num_threads())
    return found


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            return next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "")
    except OSError:
        return _platform.processor()
