"""The loads' registry: each load is registered by a decorator on its own code, with what it is and what diffusers
guards against it, and found here by name (the `load` axis, harness.core.axes). Torch-free, so the plan, the ids and
`harness --help` import nothing heavy: each load's code imports torch and diffusers inside its body.

A checkpoint load's code gives `from_pretrained` its options (beside the folder, the dtype and the layout's parallel
config, harness.rank.loading); an in-memory load's code sets the model built from the reference's weights up the way
its users do, before `enable_parallelism` is asked to shard it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.core import axes
from harness.core.registry import Registry
from harness.loads.guard import CHECK, Guard

ENABLE = "enable"  # diffusers' own tests' way, every case's load unless the plan says otherwise (the axis's default)


@dataclass(frozen=True)
class Load:
    name: str
    help: str
    from_pretrained: Callable[[], dict] | None = None  # a checkpoint load: the options `from_pretrained` is given
    prepare: Callable[[Any, Any], None] | None = None  # an in-memory load: (model, device) set up before sharding
    wrapped: bool = False  # the layout's config passed inside a `ParallelConfig` (not the bare CP/TP config)
    guard: Guard | None = None  # a combination diffusers guards tensor parallelism against: it exists on TP only

    @property
    def checkpoint(self) -> bool:
        """The model comes from the run's checkpoint folder through `from_pretrained`."""
        return self.from_pretrained is not None

    @property
    def tensor_parallel_only(self) -> bool:
        return self.guard is not None

    @property
    def refused_where(self) -> str:
        """Which call of diffusers checks the guard: `from_pretrained` its options, `enable_parallelism` the model."""
        return f"{CHECK}, from {'from_pretrained' if self.checkpoint else 'enable_parallelism'}"

    def applies(self, layout) -> bool:
        """Whether a case of this load exists on `layout` at all: a combination with tensor parallelism on its
        layouts; a wrapped config where diffusers takes one (elsewhere it loads as `pretrained` does)."""
        if self.tensor_parallel_only:
            return layout.tp > 1
        return layout.is_context_parallel or layout.tp > 1 if self.wrapped else True

    def guarded_here(self) -> Guard | None:
        """Its guard where the installed diffusers has it, or None (no combination, or a release that does not
        guard it: then the case is judged on its numbers)."""
        return self.guard if self.guard is not None and self.guard.in_force() else None

    def unavailable(self) -> str | None:
        """Why this load cannot be built on this machine (a plan-time SKIP), or None."""
        missing = self.guard.missing() if self.guard is not None else None
        return f"{self.name} needs {missing}, which is not installed" if missing else None


LOADS: Registry[Load] = Registry("load", "HARNESS_LOADS")


def _register(load: Load) -> None:
    LOADS.add(load.name, load, _owner(load))


def _owner(load: Load) -> str:
    return (load.from_pretrained or load.prepare).__module__


def checkpoint_load(help: str, *, wrapped: bool = False, guard: Guard | None = None):
    """Register the decorated function as the checkpoint load of its own name: called with nothing, it returns the
    options `from_pretrained` is given besides the folder, the dtype and the parallel config. Returned unchanged."""
    def register(options: Callable[[], dict]) -> Callable[[], dict]:
        _register(Load(options.__name__, help, from_pretrained=options, wrapped=wrapped, guard=guard))
        return options

    return register


def memory_load(help: str, *, guard: Guard | None = None):
    """Register the decorated function as the in-memory load of its own name: called with the model (built from the
    reference's weights, on its device) and the device, it sets it up before `enable_parallelism`. Returned
    unchanged."""
    def register(prepare: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        _register(Load(prepare.__name__, help, prepare=prepare, guard=guard))
        return prepare

    return register


def load_of(name: str) -> Load:
    return LOADS.of(name)


def enable_id(case_id: str) -> tuple[str, str]:
    """A case id without its load (a mode and a negative control's fault stay), and the load: the id of the case's
    `enable` twin."""
    values = axes.parse(case_id)
    return axes.spell({**values, "load": ENABLE}, values["fault"]), values["load"]
