"""The interface every case kind implements, and the small types it exchanges with the rank side and the verdict.

A kind owns its whole story: its options and limits (declared here once, they reach the CLI, pytest and
`[tool.harness.<kind>]`), what each `--plan` preset sets of them and which of its cases each plan compiles, its
checks, its figures and its detail blocks. Nothing outside `harness/kinds/` names a kind or a figure. Heavy imports
(torch, the zoo) stay inside the methods, so the options can be read without them (`pytest --help`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.core.figures import FigureSpec
from harness.core.options import Option
from harness.core.records import case_id

if TYPE_CHECKING:
    import torch

    from harness.core.evidence import Evidence
    from harness.core.records import Case
    from harness.core.reference import Reference
    from harness.core.results import CaseResult


@dataclass
class Built:
    """A case ready to run on a rank: the module `enable_parallelism` applies to, and a call that runs it once."""

    module: Any
    run: Callable[[], Any]
    cp_plan: dict | None = None  # passed to `enable_parallelism` (None: the class's own `_cp_plan`)
    kernel_scope: Any = None  # only attention kernels inside this module's forward prove the backend (None: all)
    parallelize: Callable[[Any], None] | None = None  # called with the device mesh after `enable_parallelism`
    # `run` with the proof's recording (a context manager) around only the part the proof covers; None: around all
    recorded: Callable[[Any], Any] | None = None
    forward: Callable[[], Any] | None = None  # what localization traces module by module (None: `run`)
    loss: Callable[[], Any] | None = None  # a differentiable loss: localization traces the backward too (train)
    twin: Callable[[str], None] | None = None  # makes this build the noise draw of that name (harness.rank.noise)
    # PyTorch's context parallelism (tcp layouts, harness.rank.torch_cp): the run's sequence inputs as buffers
    # {name: (tensor, seq dim)}, asked right before the run; and the output's sequence dim to unshard after it (None:
    # the output is whole on every rank already, e.g. a train case's losses and gathered gradients)
    torch_cp_buffers: Callable[[], dict] | None = None
    torch_cp_output_dim: int | None = None
    # diffusers builds the device mesh itself (no `mesh=`), as `enable_parallelism(config=ContextParallelConfig(...))`
    # in a user's script does; otherwise the launch's mesh, built once, is passed
    own_mesh: bool = False
    pipeline: Any = None  # the pipeline `module` runs in (image): what a pipeline's flow calls (harness.flows)
    # the denoising loop `run` goes through (harness.flows.denoising), for a flow that decides per step; None: one run
    denoising: Any = None

    def run_recorded(self, recording) -> Any:
        """`run` once, with `recording` (harness.rank.recorder) around the part the proof covers."""
        if self.recorded is not None:
            return self.recorded(recording)
        with recording:
            return self.run()


@dataclass(frozen=True)
class Check:
    """A check a case can fail: what its failures name (its subjects, e.g. "parameters"; "" for the case as a whole)
    and whether it has a figure (a known issue then gives the band it excuses); `one_device`: it is measured on one
    device alone (what a flow's calls did there, whether a cache reused), so no module of the ranks' run can be where
    it first went wrong, and localization is not run for it."""

    subjects: str = ""
    figure: bool = True
    one_device: bool = False


# Why `harness repro` scripts no case of PyTorch's context parallelism (the tcp layouts).
TORCH_CP_NOT_SCRIPTED = ("a case under PyTorch's context parallelism is not scripted (the scripts drive diffusers' "
                         "enable_parallelism); diffusers' context-parallel layouts are")

# The checks every kind's cases get besides its own (harness.run.verdict); `graph_break` under `--fullgraph` only,
# `load_shards` and `load_config` for the checkpoint loads only (harness.loads), `flow_effect`, `flow_equals` and
# `flow_calls` for the flows (harness.run.flow_checks), `cache_decisions` and `cache_reuse` for the flows that run a
# denoising loop (a cache: harness.run.decisions).
COMMON_CHECKS = {"rank_output": Check("ranks"), "dtensor_output": Check("output placements", figure=False),
                 "graph_break": Check(), "load_shards": Check("ranks' parameters", figure=False),
                 "load_config": Check(figure=False), "flow_effect": Check("calls", one_device=True),
                 "flow_equals": Check(one_device=True),
                 "flow_calls": Check("ranks", figure=False),
                 "cache_decisions": Check("steps", figure=False), "cache_reuse": Check(figure=False, one_device=True),
                 "repeat": Check("ranks")}

# The layout families (each with a backend that runs it) the full plan compiles on a model or two besides every model
# under ulysses2; the whole slice is sized to about 15 minutes of Inductor on 2 cores (docs/compile.md).
FULL_COMPILE_FAMILIES = (("single", "native"), ("ring2", "_native_flash"), ("tp2", "native"), ("tcp2", "native"))
# The layout families the full plan loads through from_pretrained (harness.loads), each with its backend: every
# family diffusers takes a parallel_config for, and those that load plainly (single, dp, PyTorch's CP)
LOAD_FAMILIES = (("single", "native"), ("ulysses2", "native"), ("ring2", "_native_flash"), ("tp2", "native"),
                 ("ring2xulysses2", "_native_flash"), ("tp2+ulysses2", "native"), ("dp2", "native"),
                 ("dp2xulysses2", "native"), ("tcp2", "native"))

# The layout families the flows (harness.flows) run on, each with its backend: context parallelism both ways and
# tensor parallelism, where the user's calls around enable_parallelism differ
FLOW_FAMILIES = (("ulysses2", "native"), ("ring2", "_native_flash"), ("tp2", "native"))


def every_model_slice(kind: str, families) -> list[str]:
    """The full plan's slice of `kind`: every model of the zoo on each of `families`, fp32."""
    from harness.catalogue.zoo import SPECS

    return slice_ids(kind, SPECS, families)


def slice_ids(kind: str, models: Iterable[str], layouts: Iterable[tuple[str, str]],
              dtypes: Iterable[str] = ("fp32",)) -> list[str]:
    """The ids (the default shape, without the mode) of `kind`'s cases of each model x (layout, backend) x dtype: a
    kind's part of a plan's compile slice (`compile_cases` globs over ids without their mode)."""
    layouts, dtypes = list(layouts), list(dtypes)
    return [case_id(model, "default", layout, backend, dtype, kind) for model in models for layout, backend in layouts
            for dtype in dtypes]


# What every compiled case (harness.core.modes) reports of its compile, after its kind's own figures.
COMPILE_FIGURES = (FigureSpec("graphs", "compiled graphs", "d"), FigureSpec("graph_breaks", "graph breaks", "d"),
                   FigureSpec("recompiles", "recompiles in the measured run", "d"))


class Kind:
    """One kind of case. Subclasses fill every method; nothing outside `harness/kinds/` branches on the name."""

    name: str = ""
    help: str = ""
    # The checks `judge` runs, each failure an Evidence item. Known-issue entries may excuse these by name
    # (harness.run.known_issues).
    checks: dict[str, Check] = {}
    figures: tuple[FigureSpec, ...] = ()  # what `judge` fills, in the order views show them (harness.core.figures)
    options: tuple[Option, ...] = ()  # its own options: `[tool.harness.<name>] <option>`, `--<name>-<option>`
    limits: Option | None = None  # its per-dtype limits: `[tool.harness.<name>] fp32 = ...`
    # What each `--plan` preset sets of its own options, by plan and the option's name (harness.run.settings joins
    # them to the run's own presets; the command line and `[tool.harness]` still win)
    presets: dict[str, dict[str, Any]] = {}
    cost_s: float = 0.4  # rough seconds of one case on one rank, to balance the parts of `--shard K/N`
    torch_context_parallel: bool = False  # whether its cases run under PyTorch's context parallelism (tcp layouts)
    compiles: bool = True  # its module runs under torch.compile's modes (harness.core.modes); False: SKIP there
    loads: bool = True  # the full plan loads its cases through from_pretrained too (`load_slice`); False: never
    references: str = ""  # the kind whose reference files its cases read ("": its own)
    localizes: bool = True  # a FAIL is traced module by module (False: what fails is no module's output)
    reruns: bool = True  # its run can be repeated with no side effect (one device's output between a flow's calls)
    repeats: bool = True  # its case is run twice in one launch, bit for bit alike (harness.engine.repeat)

    @property
    def reference_kind(self) -> str:
        """The kind named in the paths of its cases' references (harness.core.reference.reference_path)."""
        return self.references or self.name

    def all_options(self) -> list[Option]:
        """Its options and its limits table, owned by it (their flat keys `<kind>_<name>`)."""
        return [option.owned_by(self.name) for option in (*self.options, *((self.limits,) if self.limits else ()))]

    def policy(self, settings, dtype: str) -> Any:
        """What a case of `dtype` is judged by, from the settings (its own limits and options, the run's budgets). A
        kind with a `repro_script` returns a dataclass: its fields are what the script's template judges by."""
        return None

    def compile_slice(self, plan: str) -> list[str]:
        """The ids (without their mode) of this kind's cases that plan `plan` also compiles, its part of the plan's
        `compile_cases` (compiling costs tens of seconds a graph on a CPU); none by default."""
        return []

    def load_slice(self, plan: str) -> list[str]:
        """The ids (without load and mode) of this kind's cases that plan `plan` also loads through from_pretrained,
        its part of the plan's `load_cases`: the full plan's every model on each load family, fp32; none otherwise (nor
        ever for a kind that `loads` not)."""
        if plan != "full" or not self.loads:
            return []
        from harness.catalogue.zoo import SPECS

        return slice_ids(self.name, SPECS, LOAD_FAMILIES)

    def flow_slice(self, plan: str) -> list[str]:
        """The ids (without load, flow and mode) of this kind's cases that plan `plan` also runs with the user's
        calls around enable_parallelism (harness.flows), its part of the plan's `flow_cases`: none by default."""
        return []

    def unavailable(self) -> str | None:
        """Why this kind cannot run on this machine (a plan-time SKIP; a `NotApplicable` reason: N/A), or None."""
        return None

    def applies(self, layout) -> bool:
        """Whether a case of this kind exists on `layout` at all (data parallelism splits a training batch only)."""
        return not layout.is_data_parallel

    def crosses(self, case: Case) -> bool:
        """Whether the case is in this kind's product at all: a kind whose question depends on no dtype or backend
        runs one of each (the refusal kind), as a compiled mode runs only its slice. True by default."""
        return True

    def skip_reason(self, case: Case) -> str | None:
        """Why this kind cannot run this particular case (a plan-time SKIP; a `NotApplicable` reason: N/A), or
        None."""
        return None

    def shapes(self, spec, wanted: list[str], weights_dir: str | None) -> list[tuple[str, str | None]]:
        """(shape, weights folder) of each case of this kind for a model."""
        raise NotImplementedError

    def split_lengths(self, case: Case) -> dict[str, int] | None:
        """The sequence lengths a context-parallel layout splits, when the plan can know them; None if it cannot."""
        return None

    def reference_hash(self, case: Case) -> str:
        """The config hash the case's reference must carry (a stale reference is an error, not a comparison)."""
        raise NotImplementedError

    def capture(self, model: str, shape: str, root: Path, force: bool = False,
                weights_dir: str | None = None, **options) -> tuple[Path, bool]:
        """Write the fp32 single-device reference; returns its path and whether it was written (False: kept)."""
        raise NotImplementedError

    def captures(self, spec) -> bool:
        """Whether this kind has a reference for the model at all (its cases may still be planned, as SKIP): none of
        its own when it reads another kind's (`references`)."""
        return not self.references

    def capture_options(self, settings) -> dict:
        """The options `capture` takes from the settings (keyword arguments)."""
        return {}

    def stale(self, meta: dict, settings) -> str | None:
        """Why a sound reference does not fit what the settings ask (and the command that fixes it), or None."""
        return None

    def build(self, case: Case, reference: Reference, device, load) -> Built:
        """The case's module on `device`, its model loaded as `load` (a harness.rank.loading.LoadPlan) says."""
        raise NotImplementedError

    def save_checkpoint(self, case: Case, reference: Reference, target: Path) -> None:
        """The reference's weights as the diffusers checkpoint folder the checkpoint loads read with
        `from_pretrained` (harness.loads), written once per run (harness.run.checkpoints): the model's own."""
        from harness.catalogue.zoo import get_spec
        from harness.rank import loading

        loading.save_model(reference, get_spec(case.model).model_class(), target)

    def detach(self, output) -> Any:
        """The output as kept for comparison after the case (a CPU tensor, a picture)."""
        raise NotImplementedError

    def comparable(self, output) -> torch.Tensor:
        """The output as one contiguous fp32 CPU tensor, to compare what the ranks ended with."""
        import torch

        tensor = output if isinstance(output, torch.Tensor) else torch.as_tensor(output)
        return tensor.detach().float().cpu().contiguous()

    def measure(self, output, reference: Reference, baseline, case: Case, images_dir: Path | None,
                draws: dict | None = None) -> dict:
        """What this kind measures against the reference and the single-device baseline (a value, or its error),
        and against the other draws of its dtype's noise that `draws_for` asks for ({name: output or error})."""
        raise NotImplementedError

    def repro_script(self, case: Case) -> str | None:
        """The template under harness/versions/repro_scripts/ from which `harness repro` writes a standalone script
        of the case, or None (why: `repro_refusal`)."""
        return None

    def repro_refusal(self, case: Case) -> str:
        """Why `harness repro` writes no script for the case (`repro_script` is None)."""
        return f"{self.name} cases are not scripted"

    def draws_for(self, case: Case) -> tuple[str, ...]:
        """The other single-device noise draws the case is judged by (harness.rank.noise); none by default."""
        return ()

    def judge(self, result: CaseResult, metrics: dict, policy) -> list[Evidence]:
        """Fill the result's figures (and detail blocks) from `metrics`, run every check, and return one item for each
        that failed (none: PASS)."""
        raise NotImplementedError

    def rank_tolerance(self, policy) -> float | None:
        """How far another rank's output may be from rank 0's (None: the kind's own judge compares the ranks)."""
        return 0.0

    def flow_reference(self, reference: Reference, output) -> tuple[Reference, float]:
        """What a flow case (harness.flows) is judged against: one device's fp32 run that made the flow's calls
        (`output`) in place of the file's, and how far those calls moved it from the file (its `effect`, in the
        measure of `flow_effect_limit`): here the output's largest absolute change."""
        import torch

        output, before = torch.as_tensor(output), torch.as_tensor(reference.output)  # a picture is an array
        return replace(reference, output=output), float((output.float() - before.float()).abs().max())

    def flow_effect_limit(self, policy) -> float | None:
        """The limit a flow's `effect` is held to (harness.run.verdict): one that must change the numbers goes
        beyond it (else its calls did nothing the case could compare), one that must give them back stays within it;
        what another rank's output may differ by; None: not checked."""
        return self.rank_tolerance(policy)
