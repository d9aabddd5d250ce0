"""Every option declared once: CLI flags, pytest options and `[tool.harness]` keys share this table.

The run's own options are the fields of `Settings`; each kind declares its own (harness.kinds: `Kind.options`, its
per-dtype `limits`), written `[tool.harness.<kind>] <name>` in pyproject.toml and `--<kind>-<name>` on the command
line. Precedence: command line > `[tool.harness]` > `--plan` preset > the default: a preset fills only what neither
the command line nor the project's file gives (docs/commands.md says why; tests/unit/test_settings.py pins it).
"""

from __future__ import annotations

import copy
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from harness import flows
from harness.core.backend_names import CUDA_ONLY, EVERY_DEVICE
from harness.core.errors import HarnessError
from harness.core.layouts import DEFAULT_LAYOUTS, FULL_LAYOUTS
from harness.core.options import DTYPE_KEYS, Option
from harness.kinds import KINDS
from harness.loads import LOADS
from harness.report.images import POLICIES
from harness.run.launchers import LAUNCHERS

# What each `--plan` sets of the run's own options (the kinds add theirs: `preset`). quick: what CI runs, the default;
# full: every model, shape and layout, the GPU backends, fp16, and diffusers' refusals checked.

RUN_PRESETS: dict[str, dict[str, Any]] = {
    # every load, each on the quick plan's load slice: from_pretrained as the guide writes it and wrapped in a
    # ParallelConfig, and the tensor-parallel combinations diffusers guards (harness.loads)
    "quick": {"modes": ["eager", "compile"], "loads": list(LOADS), "flows": flows.quick_values()},
    "full": {
        "models": "all",
        "shapes": ["all"],
        "layouts": list(FULL_LAYOUTS),
        "backends": [*EVERY_DEVICE, *CUDA_ONLY],
        "dtypes": ["fp32", "bf16", "fp16"],
        "check_refusals": True,
        "modes": ["eager", "compile"],
        "loads": ["all"],
        "flows": ["all"],
    },
}


def _option(default: Any, help: str, is_list: bool = False, choices: tuple[str, ...] = ()):
    return field(default_factory=lambda: copy.deepcopy(default),
                 metadata={"help": help, "is_list": is_list, "choices": choices})


AUTO_TIMEOUT_S, AUTO_TIMEOUT_PER_GB_S = 300.0, 60.0  # the case timeout when `case_timeout` is 0


def auto_case_timeout(weight_bytes: int) -> float:
    """A wide margin for weights of `weight_bytes`: a hang is found by the stall detection (harness.run.launch) long
    before; this bound is for a group that spins without progress."""
    return AUTO_TIMEOUT_S + AUTO_TIMEOUT_PER_GB_S * weight_bytes / 2**30


@dataclass
class Settings:
    """Every option, declared once: a CLI flag (`--case-timeout`), a pytest option (`--harness-case-timeout`) and a
    `[tool.harness]` key (`case_timeout`) each. `root` is the folder relative paths are taken from."""

    plan: str = _option("quick", "Preset for the options not given: quick (CI) or full (everything).",
                        choices=tuple(RUN_PRESETS))
    models: list[str] = _option(["flux", "flux2", "qwenimage"], "Models of the zoo to run, comma-separated.", True)
    kinds: list[str] = _option(list(KINDS), "Kinds of case to run: " + ", ".join(f"{kind.name} ({kind.help})"
                                                                               for kind in KINDS.values()) + ".",
                               True)
    weights: str | None = _option(None, "A local diffusers checkpoint folder to run the image cases on (never the "
                                        "hub).")
    shapes: list[str] = _option(["default", "masked"], "Input shapes per model (default, txt7, img15, masked, ...) "
                                                       "or 'all'; a model runs those it has.", True)
    layouts: list[str] = _option(list(DEFAULT_LAYOUTS), "Parallel layouts, e.g. ulysses2,ring2,ring2xulysses2,tp2.",
                                 True)
    backends: list[str] = _option(list(EVERY_DEVICE), "Attention backends to run.", True)
    dtypes: list[str] = _option(["fp32", "bf16"], "Dtypes to run (fp32, bf16, fp16), comma-separated.", True)
    modes: list[str] = _option(["eager"], "How the model runs: eager, compile (torch.compile, Inductor), regional "
                                          "(diffusers' compile_repeated_blocks) or aot_eager (Dynamo and "
                                          "AOTAutograd only); compiling costs tens of seconds to minutes a graph on "
                                          "a CPU (docs/compile.md).", True)
    compile_cases: list[str] = _option(["*"], "Globs over case ids without their mode: the cases the compiled modes "
                                              "also run (default every case of the plan; each plan has its compile "
                                              "slice). `--modes all` runs every mode on every case.", True)
    loads: list[str] = _option(["enable"], "How the model gets its weights and its parallelism: enable (the "
                                           "reference's weights, then enable_parallelism), pretrained "
                                           "(from_pretrained(folder, parallel_config=...) from a sharded checkpoint, "
                                           "as diffusers' guide says), pretrained_wrapped, the tp_* combinations "
                                           "diffusers guards tensor parallelism against, or all (docs/loading.md).",
                               True)
    load_cases: list[str] = _option(["*"], "Globs over case ids without their load: the cases the loads other than "
                                           "enable also run (default every case of the plan; each plan has its "
                                           "load slice).", True)
    flows: list[str] = _option(["none"], "What the user calls around enable_parallelism, each before it (`lora`) or "
                                         "after it (`lora_after`): none, the flows of harness/flows (docs/flows.md), "
                                         "or all.", True)
    flow_cases: list[str] = _option(["*"], "Globs over case ids without their flow: the cases the flows other than "
                                           "none also run (default every case of the plan; each plan has its flow "
                                           "slice).", True)
    fullgraph: bool = _option(False, "A compiled case whose model breaks into more than one graph (a graph break) is "
                                     "FAIL, not only counted.")
    compile_cache: str = _option("", "Folder of Inductor's compile cache for the ranks (TORCHINDUCTOR_CACHE_DIR): a "
                                     "graph compiled once is reused by later cases and runs; empty: the report "
                                     "folder's own, <report_dir>.work/compile-cache/, which no other live run "
                                     "shares.")
    references: str = _option("references", "Directory of the captured fp32 references.")
    report_dir: str = _option("reports", "Directory where matrix.csv, matrix.md and results.json are written (the "
                                          "artifact to upload; caches and work files go to <report_dir>.work).")
    known_issues: str = _option("known_issues.toml", "TOML file of known failures that become XFAIL.")
    compare_with: str = _option("", "A base run's report folder: the page marks per cell what changed against it "
                                    "(new failures, fixes, changed figures).")
    case_timeout: float = _option(0.0, f"Seconds a case may run before it is TIMEOUT (0: {AUTO_TIMEOUT_S:.0f} s + "
                                       f"{AUTO_TIMEOUT_PER_GB_S:.0f} s per GB of weights).")
    check_refusals: bool = _option(False, "Run the cases diffusers is expected to refuse (backend not "
                                          "context-parallel capable, uneven split) to see it refuse, instead of SKIP.")
    cpu_max_ranks: int = _option(4, "Most ranks a CPU-only machine runs; larger layouts are SKIP.")
    budget_factor: float = _option(1.25, "Low precision: most a layout may multiply the dtype's own mean error by.")
    budget_max_factor: float = _option(1.5, "Low precision: most a layout may multiply the dtype's own max error by.")
    localize: bool = _option(False, "Find where every case that ran breaks (the first module whose output leaves "
                                    "the single-device run's), not only the FAIL cases.")
    localize_ops: bool = _option(False, "Where one device moved off its stored reference by a change to diffusers "
                                        "the run injects (a model-change fault), also name the first aten op that "
                                        "moved inside its first moved module, against the same code without it.")
    coverage: bool = _option(False, "Run every rank under coverage.py and report which statements of diffusers' "
                                    "parallel code the plan executed, per module and function, each one never "
                                    "executed with its reason (the page, matrix.md, results.json).")
    keep_work: bool = _option(False, "Keep <report-dir>/work (each launch's log, rank events and the shared "
                                     "baselines) after a run in which every case ended well; it is kept anyway "
                                     "when one failed.")
    allow_no_parallel: bool = _option(False, "Exit 0 even when no case with more than one rank ran (by default "
                                             "such a run exits 1: it checked no parallel layout).")
    xfail_strict: bool = _option(False, "A known issue that no longer reproduces (XPASS) fails the run, as pytest's "
                                        "xfail_strict: its entry must then be removed or narrowed.")
    images: str = _option("failing", "PNGs an image case keeps: failing (all four for FAIL/ERROR/TIMEOUT, one "
                                     "thumbnail otherwise) or all (reference, candidate, difference, SSIM map).",
                          choices=POLICIES)
    launcher: str = _option("local", "How ranks start: local (torchrun on this host), torchrun (multi-node c10d "
                                     "rendezvous; run the same command on every node) or slurm (srun, or an sbatch "
                                     "script with --slurm-script).", choices=tuple(LAUNCHERS))
    rank_start: str = _option("fork", "How a launch on this host starts its ranks: fork (from one warm process per "
                                      "run that imported torch and diffusers once: well under a second a launch) or "
                                      "torchrun (each launch imports them again). Launches over several nodes, on "
                                      "CUDA or with --coverage use torchrun.", choices=("fork", "torchrun"))
    nnodes: int = _option(1, "Nodes a torchrun or slurm launch spans; a world size that divides by it spreads over "
                             "all of them.")
    node_rank: int = _option(0, "This node's number under --launcher torchrun: 0 plans, judges and writes reports; "
                                "1..nnodes-1 only run ranks.")
    rdzv_endpoint: str = _option("", "HOST:PORT of the c10d rendezvous under --launcher torchrun (node 0's address, "
                                     "reachable from every node).")
    gpus_per_node: int = _option(0, "GPUs each node gives the run (0: every GPU torch sees on node 0); with nnodes, "
                                    "the largest world size on GPUs.")
    slurm_script: str = _option("", "With --launcher slurm: write this sbatch script instead of running srun.")
    slurm_options: list[str] = _option([], "Extra srun/sbatch options with --launcher slurm, comma-separated, e.g. "
                                           "--slurm-options=--partition=gpu,--time=02:00:00.", True)
    shard: str = _option("", "K/N: run only part K of N of the plan (balanced by predicted cost, each model's "
                             "world size whole); `harness merge` joins the N reports.")
    root: Path = field(default=Path("."), metadata={"option": False})
    kind_values: dict[str, Any] = field(default_factory=dict, metadata={"option": False})  # by flat key

    @property
    def values(self) -> dict[str, Any]:
        """Every option's value by its flat key (a kind's too: `train_steps`)."""
        return {key: self.option(key) for key in OPTIONS}

    def option(self, key: str) -> Any:
        return self.kind_values[key] if key in self.kind_values else getattr(self, key)

    def of(self, kind: str, name: str) -> Any:
        """The value of kind `kind`'s own option `name`."""
        return self.kind_values[f"{kind}_{name}"]

    def limits(self, kind: str, dtype: str) -> Any:
        """Kind `kind`'s limits for `dtype` (its per-dtype table; None where it has none for that dtype)."""
        return (self.kind_values.get(f"{kind}_limits") or {}).get(dtype)

    def path(self, name: str) -> Path:
        value = Path(getattr(self, name))
        return value if value.is_absolute() else self.root / value

    def kind_scope(self, kind: str) -> tuple[list[str], list[str], list[str]]:
        """The models, layouts and shapes a kind runs: its own `models` / `layouts` / `shapes` options where it
        declares them (train), else --models, --layouts and --shapes."""
        return tuple(self.kind_values.get(f"{kind}_{axis}") or getattr(self, axis) for axis in SCOPED)

    @property
    def scopes(self) -> dict[str, tuple[list[str], list[str], list[str]]]:
        return {kind: self.kind_scope(kind) for kind in self.kinds}


SCOPED = ("models", "layouts", "shapes")  # the plan axes a kind may narrow with options of its own names

OPTIONS: dict[str, Option] = {
    f.name: Option(f.name, f.default_factory(), f.metadata["help"], f.metadata["is_list"],
                   choices=f.metadata["choices"])
    for f in fields(Settings) if f.metadata.get("option", True)
}
OPTIONS.update({option.key: option for kind in KINDS.values() for option in kind.all_options()})

# The options `harness run` and the pytest plugin take as flags (capture and selftest take subsets).
RUN_OPTIONS = tuple(name for name, option in OPTIONS.items() if not option.is_table)

def preset(plan: str) -> dict[str, Any]:
    """What `--plan <plan>` sets, by flat key: the run's own options (`RUN_PRESETS`), each kind's (`Kind.presets`),
    and the compile, load and flow slices its kinds name (`Kind.compile_slice`, `Kind.load_slice`,
    `Kind.flow_slice`)."""
    values = dict(RUN_PRESETS[plan])
    for kind in KINDS.values():
        values.update({f"{kind.name}_{name}": value for name, value in kind.presets.get(plan, {}).items()})
    for option, part in (("compile_cases", "compile_slice"), ("load_cases", "load_slice"),
                         ("flow_cases", "flow_slice")):
        ids = [case_id for kind in KINDS.values() for case_id in getattr(kind, part)(plan)]
        if ids:
            values[option] = ids
    return values


def find_pyproject(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.exists():
            return candidate
    return None


def load_settings(overrides: dict[str, Any] | None = None, start: Path | None = None) -> Settings:
    """Defaults, then `[tool.harness]` (and its `[tool.harness.<kind>]` tables), then the `--plan` preset for what
    neither gave, then the non-None `overrides` (from the CLI or pytest, by flat key)."""
    start = (start or Path.cwd()).resolve()
    pyproject = find_pyproject(start)
    table: dict[str, Any] = {}
    if pyproject is not None:
        try:
            table = tomllib.loads(pyproject.read_text()).get("tool", {}).get("harness", {})
        except tomllib.TOMLDecodeError as error:
            raise HarnessError(f"{pyproject}: invalid TOML ({error})") from None
    root = pyproject.parent if pyproject is not None else start
    values = {key: copy.deepcopy(option.default) for key, option in OPTIONS.items()}
    given = _from_pyproject(table, values, pyproject)
    overrides = {key: value for key, value in (overrides or {}).items() if value is not None}
    plan = overrides.get("plan", values["plan"])
    if plan not in RUN_PRESETS:
        raise HarnessError(f"unknown plan {plan!r}; valid plans: {', '.join(OPTIONS['plan'].choices)}")
    explicit = given | set(overrides)
    filled = {key: value for key, value in preset(plan).items() if key not in explicit}
    for key, value in {**filled, **overrides}.items():
        values[key] = split_list(value) if OPTIONS[key].is_list else value
    for kind in KINDS:  # `--models wan --kinds train` trains wan: a scope the user gives is every kind's
        for axis in SCOPED:
            if axis in explicit and f"{kind}_{axis}" in OPTIONS and f"{kind}_{axis}" not in explicit:
                values[f"{kind}_{axis}"] = None
    for key, value in values.items():
        values[key] = _typed(OPTIONS[key], value, pyproject)
    for key, option in OPTIONS.items():
        if option.choices and values[key] not in option.choices:
            raise HarnessError(f"option {key}: {values[key]!r} is not one of {', '.join(option.choices)}")
    for key in ("models", *(f"{kind}_models" for kind in KINDS)):
        if values.get(key) == ["all"]:
            from harness.catalogue.zoo import SPECS

            values[key] = list(SPECS)
    own = {key: values.pop(key) for key in list(values) if OPTIONS[key].kind}
    return Settings(**values, root=root, kind_values=own)


def _from_pyproject(table: dict, values: dict, pyproject) -> set[str]:
    """`[tool.harness]` into `values` (by flat key); returns the keys it gave. A kind's table holds its options by
    their own names and its per-dtype limits under the dtypes' names (`[tool.harness.tensor] fp32 = 1e-5`)."""
    given = set()
    for key, value in table.items():
        name = key.replace("-", "_")
        if name in KINDS:
            given |= _kind_table(name, value, values, pyproject)
        elif name in OPTIONS and not OPTIONS[name].kind:
            values[name] = value
            given.add(name)
        else:
            raise HarnessError(_unknown(pyproject, key))
    return given


def _kind_table(kind: str, table: Any, values: dict, pyproject) -> set[str]:
    if not isinstance(table, dict):
        raise HarnessError(f"{pyproject}: [tool.harness] {kind} must be a table of the {kind} kind's options, e.g. "
                           f"[tool.harness.{kind}]")
    given, limits = set(), {key: value for key, value in table.items() if key in DTYPE_KEYS}
    if limits:
        key = f"{kind}_limits"
        if key not in OPTIONS:
            raise HarnessError(f"{pyproject}: [tool.harness.{kind}] the {kind} kind has no per-dtype limits")
        values[key] = _merged(OPTIONS[key], values[key], limits, pyproject)
        given.add(key)
    for name, value in table.items():
        key = f"{kind}_{name.replace('-', '_')}"
        if name in DTYPE_KEYS:
            continue
        if key not in OPTIONS or OPTIONS[key].is_table:
            mine = ", ".join([*(option.name for option in KINDS[kind].options), *DTYPE_KEYS])
            raise HarnessError(f"{pyproject}: unknown key [tool.harness.{kind}] {name!r}; valid keys: {mine}")
        values[key] = value
        given.add(key)
    return given


def _unknown(pyproject, key: str) -> str:
    moved = {option.key: option for option in OPTIONS.values() if option.kind}
    if key in moved:
        return (f"{pyproject}: [tool.harness] {key!r} is the {moved[key].kind} kind's option: write "
                f"{moved[key].where()} = ...")
    if key == "tolerance" or key == "train_tolerance":
        kind = "tensor" if key == "tolerance" else "train"
        return f"{pyproject}: [tool.harness.{key}] moved to [tool.harness.{kind}] (its per-dtype limits)"
    valid = [name for name, option in OPTIONS.items() if not option.kind] + list(KINDS)
    return f"{pyproject}: unknown key [tool.harness] {key!r}; valid keys: {', '.join(valid)}"


def _merged(option: Option, default: dict, given: Any, pyproject) -> dict:
    """A per-dtype table: the default per dtype, with the keys pyproject.toml gives replaced (as numbers)."""
    merged = copy.deepcopy(default)
    for dtype, value in given.items():
        try:
            if isinstance(value, dict):
                merged[dtype] = {**merged.get(dtype, {}), **{key: float(v) for key, v in value.items()}}
            else:
                merged[dtype] = float(value)
        except (TypeError, ValueError):
            raise HarnessError(f"{pyproject}: [tool.harness.{option.kind}] {dtype}: {value!r} is not a number") \
                from None
    return merged


def _typed(option: Option, value: Any, pyproject) -> Any:
    """Values from pytest options and TOML arrive as text or another type; give each the type of its default."""
    kind = type(option.default)
    if option.is_list or option.is_table or option.default is None or value is None or isinstance(value, kind):
        return value
    try:
        if kind is bool:
            text = str(value).strip().lower()
            if text not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ValueError(text)
            return text in ("1", "true", "yes", "on")
        return kind(value)
    except (TypeError, ValueError):
        where = f" ({pyproject})" if pyproject else ""
        raise HarnessError(f"option {option.name}: {value!r} is not a {kind.__name__}{where}") from None


def split_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return list(value)
