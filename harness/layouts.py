"""Layout names (`single`, `ulysses2`, `ring2`, `ring2xulysses2`, `tp2`, ...) and the diffusers configs they become."""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.errors import HarnessError

DEFAULT_LAYOUTS = ("single", "ulysses2", "ring2", "ulysses4", "ring4", "ring2xulysses2", "tp2", "tp4")

_PATTERN = re.compile(
    r"^(?:(?P<single>single)"
    r"|ring(?P<rx>\d+)xulysses(?P<ux>\d+)"
    r"|ulysses(?P<u>\d+)(?P<uany>any)?"
    r"|ring(?P<r>\d+)(?P<rany>any)?"
    r"|tp(?P<tp>\d+))$"
)


@dataclass(frozen=True)
class Layout:
    """A parallel configuration; `world_size` ranks run it, rank 0 reports."""

    name: str
    ring: int = 1
    ulysses: int = 1
    tp: int = 1
    anything: bool = False

    @property
    def world_size(self) -> int:
        return self.ring * self.ulysses * self.tp

    @property
    def is_context_parallel(self) -> bool:
        return self.ring * self.ulysses > 1

    @property
    def needs_lse(self) -> bool:
        """Ring attention merges partial results with the log-sum-exp, which the backend must return."""
        return self.ring > 1

    def diffusers_config(self, mesh=None):
        """The `ContextParallelConfig` / `TensorParallelConfig` that `enable_parallelism` receives."""
        from diffusers import ContextParallelConfig, TensorParallelConfig

        if self.tp > 1:
            return TensorParallelConfig(tp_degree=self.tp, mesh=mesh)
        if self.is_context_parallel:
            return ContextParallelConfig(
                ring_degree=self.ring,
                ulysses_degree=self.ulysses,
                ulysses_anything=self.anything and self.ulysses > 1,
                ring_anything=self.anything and self.ring > 1,
                mesh=mesh,
            )
        return None

    def mesh_spec(self) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
        """The device mesh diffusers would build for this layout, so a worker can build it once and reuse it."""
        if self.tp > 1:
            return (self.tp,), ("tp",)
        if self.is_context_parallel:
            return (self.ring, self.ulysses), ("ring", "ulysses")
        return None


def parse_layout(name: str) -> Layout:
    match = _PATTERN.match(name)
    if match is None:
        raise HarnessError(
            f"unknown layout {name!r}; valid forms: single, ulyssesN, ulyssesNany, ringN, ringNany, "
            "ringRxulyssesU, tpN (N >= 2)"
        )
    groups = {key: value for key, value in match.groupdict().items() if value}
    if "single" in groups:
        return Layout(name)
    degrees = {key: int(value) for key, value in groups.items() if value.isdigit()}
    if any(value < 2 for value in degrees.values()):
        raise HarnessError(f"layout {name!r}: every degree must be at least 2")
    if "tp" in degrees:
        return Layout(name, tp=degrees["tp"])
    ring = degrees.get("r", degrees.get("rx", 1))
    ulysses = degrees.get("u", degrees.get("ux", 1))
    return Layout(name, ring=ring, ulysses=ulysses, anything=bool(groups.get("uany") or groups.get("rany")))
