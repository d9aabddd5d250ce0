"""What crosses a process boundary, typed: a case, what a launch group is given, and what a rank reports for a case.

The lowest layer: the launcher, the worker and the verdict all import it; it imports nothing of theirs. Records
travel as JSON (group.json, the ranks' event lines, results.partial.jsonl) through `to_dict` / `from_dict`.
"""

from __future__ import annotations

import signal
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from harness.core import axes
from harness.core.layouts import Layout, parse_layout

# The node a rank runs on (0 plans and judges), set by the harness on each node's torchrun: ranks report it in their
# events so a failure names its node as well as its rank.
NODE_ENV = "HARNESS_NODE_RANK"
# Every rank runs on this many CPU threads unless OMP_NUM_THREADS says otherwise (ranks share a node's cores):
# another count sums fp32 in another order, ~1e-7 apart on some zoo models (docs/localization.md)
RANK_THREADS = "1"
STACKS_SIGNAL = signal.SIGUSR1  # a rank dumps its Python stacks on it (faulthandler); the launcher sends it to a hang


@dataclass(frozen=True)
class Case:
    """One planned run: model x shape x layout x backend x dtype x kind x load x flow x mode; its id is the pytest id
    too."""

    model: str
    layout: Layout
    backend: str
    dtype: str
    kind: str = "tensor"
    shape: str = "default"
    mode: str = "eager"  # eager or compiled (harness.core.modes)
    load: str = "enable"  # enable_parallelism or from_pretrained (harness.loads)
    flow: str = "none"  # what the user calls around enable_parallelism (harness.flows)
    fault: str | None = None  # a deliberate bug for negative controls (harness.faults)
    weights_dir: str | None = None  # a local checkpoint folder (`--weights`); the shape then names the folder
    localize: bool = False  # run to find where it breaks (harness.rank.localize), not to judge it again

    @property
    def case_id(self) -> str:
        return axes.spell(self.axis_values(), self.fault)

    def axis_values(self) -> dict[str, str]:
        """Its value on every axis (harness.core.axes), the layout by its name."""
        return {name: getattr(self, name).name if name == "layout" else getattr(self, name) for name in axes.NAMES}

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**data, "layout": self.layout.name}

    @classmethod
    def from_dict(cls, data: dict) -> Case:
        known = {f.name for f in fields(cls)}
        given = {key: value for key, value in data.items() if key in known}
        return cls(**{**given, "layout": parse_layout(data["layout"])})


def case_id(model: str, shape: str, layout: str, backend: str, dtype: str, kind: str, fault: str | None = None,
            **more: str) -> str:
    """The id of a case with these axis values (harness.core.axes spells it; `more`: axes added later)."""
    values = {"model": model, "shape": shape, "layout": layout, "backend": backend, "dtype": dtype, "kind": kind}
    return axes.spell({**values, **more}, fault)


def without_fault(case_id: str) -> str:
    """The id of the case a negative control injected its fault into (the id itself when there is none)."""
    return axes.spell(axes.parse(case_id))


@dataclass
class GroupSpec:
    """What one torchrun launch is given (group.json): where to write, where the references are, its cases."""

    workdir: str
    references: str
    images_dir: str | None
    cases: list[Case]
    baselines: str | None = None  # a folder the run's launches share single-device baselines through (None: none)
    compile_cache: str | None = None  # Inductor's cache folder for the ranks (None: Inductor's default)
    checkpoints: str | None = None  # the run's checkpoint folders for the from_pretrained loads (harness.loads)
    # `--coverage`: the folder each rank writes its coverage data to, and the source files it measures
    coverage_dir: str | None = None
    coverage_files: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"workdir": self.workdir, "references": self.references, "images_dir": self.images_dir,
                "cases": [case.to_dict() for case in self.cases], "baselines": self.baselines,
                "compile_cache": self.compile_cache, "checkpoints": self.checkpoints,
                "coverage_dir": self.coverage_dir, "coverage_files": list(self.coverage_files)}

    @classmethod
    def from_dict(cls, data: dict) -> GroupSpec:
        return cls(data["workdir"], data["references"], data.get("images_dir"),
                   [Case.from_dict(case) for case in data["cases"]], data.get("baselines"), data.get("compile_cache"),
                   data.get("checkpoints"), data.get("coverage_dir"), list(data.get("coverage_files") or []))


@dataclass
class CaseRecord:
    """What the run of one case produced, before judging: rank 0's measurements, or why there are none.

    `metrics` is what the case's kind measured (only that kind reads it); everything else is common to all kinds.
    """

    case_id: str
    error: str | None = None
    error_rank: int | None = None  # None: every rank failed alike (diffusers' own refusal), or no rank to name
    traceback: str = ""
    timeout: bool = False
    seconds: float | None = None
    forward_s: float | None = None
    peak_mem_mb: float | None = None
    peak_mem_mb_per_rank: list[float] = field(default_factory=list)
    seconds_per_rank: list[float | None] = field(default_factory=list)
    dispatched: dict[str, int] = field(default_factory=dict)
    kernels: dict[str, int] | None = None  # None: not recorded
    functions: dict[str, int] = field(default_factory=dict)  # module.qualname of each backend function that ran
    expected_function: str | None = None  # what the requested backend must hold (harness.catalogue.backends)
    comms: dict[str, dict[str, list[int]]] | None = None  # module -> collective -> [count, bytes] (None: 1 rank)
    comms_expected: list[dict] = field(default_factory=list)  # the layout's minimums (harness.rank.comms_check)
    output_placements: str | None = None  # the output was a DTensor with these placements (diffusers returns plain)
    rank_max_diff: list[float | None] = field(default_factory=list)  # each rank's output vs rank 0's (None: shape)
    phases: dict[str, float] = field(default_factory=dict)  # rank 0's seconds per phase of the case
    compiled: dict[str, Any] | None = None  # what torch.compile made of the model (harness.rank.compiled); None: eager
    # How a checkpoint load ran (harness.rank.loading): its call, a note, and each rank's parameters whose local shard
    # differs from what `enable_parallelism` gives on the same layout; None: the `enable` load
    load: dict[str, Any] | None = None
    # Each rank's nn.Linear calls at each step of a flow's denoising loop (harness.flows.denoising): what every rank
    # decided at every step; None: the case ran once
    steps: list[list[int] | None] | None = None
    step_labels: list[str] | None = None  # what each entry of a rank's `steps` was: "step 0 cond", "step 0 uncond", ...
    # What the calls of a flow (harness.flows) changed of the model on each rank, one line per change
    # (harness.flows.state); None: the case has no flow
    flow_changes: list[list[str] | None] | None = None
    warnings: list[str] = field(default_factory=list)  # what diffusers warned of on rank 0 while the case ran
    metrics: dict[str, Any] = field(default_factory=dict)
    # The launcher's, not a rank's: the earlier attempt of this case that a rank's native death ended ({"error",
    # "traceback": the dead rank's own stack}); the case then ran once more in a fresh group (harness.run.launch)
    rank_death: dict[str, str] | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CaseRecord:
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names - {"event", "rank", "time"}
        if unknown:
            raise ValueError(f"case record with unknown fields {sorted(unknown)}")
        return cls(**{key: value for key, value in data.items() if key in names})


@dataclass
class Outcome:
    """What the launcher learned about one case: the worker's record, or why none came."""

    case: Case
    record: CaseRecord


@dataclass
class ModuleTrace:
    """Each module's error in execution order (forward, or backward order for gradients), the first above its limit,
    the line that names it, and the modules that could not be compared (harness.rank.localize)."""

    modules: list[dict[str, Any]]  # module, error, limit, how (and dtype_error, input_error where measured)
    first: int | None
    line: str | None
    uncompared: list[str] = field(default_factory=list)


@dataclass
class Localization:
    """Where a case breaks: its forward trace, its backward's (train), the one-line summary, and why the backward
    could not be traced where it could not."""

    forward: ModuleTrace
    backward: ModuleTrace | None = None
    summary: str = ""
    untraced: str | None = None

    def to_dict(self) -> dict:
        """The forward's fields at the top (as the page reads them), the backward's under `backward`."""
        return {**asdict(self.forward), "backward": asdict(self.backward) if self.backward else None,
                "summary": self.summary, "backward_untraced": self.untraced}

    @classmethod
    def from_dict(cls, data: dict) -> Localization:
        names = {f.name for f in fields(ModuleTrace)}
        backward = data.get("backward")
        return cls(ModuleTrace(**{key: data[key] for key in names if key in data}),
                   ModuleTrace(**{key: backward[key] for key in names if key in backward}) if backward else None,
                   data.get("summary", ""), data.get("backward_untraced"))
