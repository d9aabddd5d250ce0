"""Layout names (`single`, `ulysses2`, `ring2`, `ring2xulysses2`, `ulysses2any`, `tp2`, `tp2+ulysses2`, `dp2`,
`dp2xulysses2`, ...) and the diffusers configs they become.

`ringNalltoall` asks diffusers' ring to rotate K/V with all-to-all (`rotate_method="alltoall"`) and
`ringRxulyssesUany` asks for the *any mode of both dimensions: configs diffusers 0.42.1 refuses (an expected refusal,
harness.catalogue.predictions), so its validation is run, and a release that accepts them is judged like any other.

`dpN` is data parallelism: N ranks each train on 1/N of the batch (train cases only); `dpNx<cp>` combines it with a
context-parallel layout, every data-parallel rank holding a context-parallel group, as torchtitan lays out its mesh.

`tcpN` is PyTorch's own context parallelism (`torch.distributed.tensor.experimental.context_parallel`), not
diffusers': the model's sequence inputs sharded as buffers, SDPA patched into PyTorch's ring with the all-gather
rotation; `tcpNalltoall` rotates K/V with all-to-all; `tcpNlb` leaves PyTorch's load balancing on (its default);
`dpNxtcpM` is FSDP2 over `dp` and PyTorch's CP over `cp` on one 2-D mesh, as torchtitan trains Flux (docs/torch_cp.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.core.errors import HarnessError

# The *any layouts at degree 2 are in the quick plan for the code only they run (uneven shards, the any all-to-alls).
DEFAULT_LAYOUTS = ("single", "ulysses2", "ring2", "ulysses4", "ring4", "ring2xulysses2", "ulysses2any", "ring2any",
                   "tp2", "tp4")
FULL_LAYOUTS = (*DEFAULT_LAYOUTS, "ulysses4any", "ulysses3any", "ring2alltoall", "ring2xulysses2any", "tp3",
                "tp2+ulysses2", "tp2+ring2",
                "dp2", "dp2xulysses2", "dp2xring2", "tcp2", "tcp2alltoall", "tcp4", "tcp4alltoall", "tcp2lb",
                "dp2xtcp2")

_CP = (r"(?:ring(?P<rx>\d+)xulysses(?P<ux>\d+)(?P<xany>any)?|ulysses(?P<u>\d+)(?P<uany>any)?"
       r"|ring(?P<r>\d+)(?P<rany>any)?(?P<rrotate>alltoall)?)")
_TCP = r"tcp(?P<t>\d+)(?P<rotate>alltoall)?(?P<lb>lb)?"
_PATTERN = re.compile(rf"^(?:(?P<single>single)|tp(?P<tp>\d+)(?:\+{_CP})?"
                      rf"|dp(?P<dp>\d+)(?:x(?:{_CP.replace('?P<', '?P<d_')}|{_TCP.replace('?P<', '?P<e_')}))?"
                      rf"|{_CP.replace('?P<', '?P<c_')}|{_TCP})$")
FORMS = ("single, ulyssesN, ulyssesNany, ringN, ringNany, ringNalltoall, ringRxulyssesU, ringRxulyssesUany, tpN, "
         "tpN+ulyssesM, tpN+ringM, dpN, "
         "dpNx<any of the context-parallel forms>, tcpN, tcpNalltoall, tcpNlb (PyTorch's context parallelism), "
         "dpNxtcpM (N, M >= 2)")


@dataclass(frozen=True)
class Layout:
    """A parallel configuration; `world_size` ranks run it, rank 0 reports."""

    name: str
    ring: int = 1
    ulysses: int = 1
    tp: int = 1
    anything: bool = False
    dp: int = 1
    torch_cp: int = 1  # PyTorch's context parallelism (`context_parallel`), not diffusers'
    rotate: str = "allgather"  # the ring's K/V rotation: PyTorch's `set_rotate_method`, diffusers' `rotate_method`
    load_balance: bool = False  # its `_cp_options.enable_load_balance` (PyTorch's default is on)

    @property
    def world_size(self) -> int:
        return self.dp * self.ring * self.ulysses * self.tp * self.torch_cp

    @property
    def is_torch_context_parallel(self) -> bool:
        """PyTorch's own context parallelism: no `enable_parallelism`, the run wrapped in `context_parallel`."""
        return self.torch_cp > 1

    @property
    def is_data_parallel(self) -> bool:
        return self.dp > 1

    @property
    def is_context_parallel(self) -> bool:
        return self.ring * self.ulysses > 1

    def mesh_spec(self) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
        """The device mesh for this layout (a 2-D one when TP and CP combine), built once per launch and reused."""
        if self.is_torch_context_parallel:  # torchtitan's mesh: (dp, cp)
            return ((self.dp, self.torch_cp), ("dp", "cp")) if self.dp > 1 else ((self.torch_cp,), ("cp",))
        shape, names = [], []
        for degree, name in ((self.dp, "dp"), (self.tp, "tp"), (self.ring, "ring"), (self.ulysses, "ulysses")):
            if name == "dp" and degree == 1:
                continue
            if degree > 1 or (name != "tp" and self.is_context_parallel):
                shape.append(degree)
                names.append(name)
        return (tuple(shape), tuple(names)) if shape else None

    def diffusers_config(self, mesh=None):
        """What `enable_parallelism` receives: a `ContextParallelConfig`, a `TensorParallelConfig`, or both in a
        `ParallelConfig` (diffusers decides whether it accepts the combination).

        Only the arguments the installed diffusers accepts are passed (harness.core.compat): before 0.38 there is no
        `mesh=` (diffusers builds its own), before 0.37 no `ulysses_anything`. A layout a release cannot express
        at all is a plan-time SKIP (`compat.layout_missing`), so asking for it here is an error, not a silent
        fallback to another layout."""
        import diffusers

        from harness.core import compat

        missing = compat.layout_missing(self)
        if missing is not None:
            raise HarnessError(f"layout {self.name}: {missing}")
        cp = tp = None
        if self.is_context_parallel:  # the degrees a user writes: diffusers fills in the other (1)
            options = {name: degree for name, degree in (("ring_degree", self.ring), ("ulysses_degree", self.ulysses))
                       if degree > 1}
            if self.rotate != "allgather" and self.ring > 1:
                options["rotate_method"] = self.rotate
            if self.anything and self.ulysses > 1:
                options["ulysses_anything"] = True
            if self.anything and self.ring > 1:
                options["ring_anything"] = True
            if mesh is not None and compat.has("cp_mesh"):
                options["mesh"] = mesh["ring", "ulysses"] if self.tp > 1 or self.dp > 1 else mesh
            cp = diffusers.ContextParallelConfig(**options)
        if self.tp > 1:
            tp = diffusers.TensorParallelConfig(tp_degree=self.tp, mesh=mesh["tp"] if mesh is not None and cp else mesh)
        if cp is not None and tp is not None:
            return diffusers.ParallelConfig(context_parallel_config=cp, tensor_parallel_config=tp)
        return cp or tp


def parse_layout(name: str) -> Layout:
    match = _PATTERN.match(name)
    if match is None:
        raise HarnessError(f"unknown layout {name!r}; valid forms: {FORMS}")
    groups = {key.removeprefix("c_").removeprefix("d_").removeprefix("e_"): value
              for key, value in match.groupdict().items() if value}
    if "single" in groups:
        return Layout(name)
    degrees = {key: int(value) for key, value in groups.items() if value.isdigit()}
    if any(value < 2 for value in degrees.values()):
        raise HarnessError(f"layout {name!r}: every degree must be at least 2")
    ring = degrees.get("r", degrees.get("rx", 1))
    ulysses = degrees.get("u", degrees.get("ux", 1))
    anything = bool(groups.get("uany") or groups.get("rany") or groups.get("xany"))
    return Layout(name, ring=ring, ulysses=ulysses, tp=degrees.get("tp", 1), anything=anything,
                  dp=degrees.get("dp", 1), torch_cp=degrees.get("t", 1),
                  rotate=groups.get("rotate", groups.get("rrotate", "allgather")),
                  load_balance=bool(groups.get("lb")))
