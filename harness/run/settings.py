"""Every option declared once: CLI flags, pytest options and `[tool.harness]` keys share this table.

Precedence: command line > `[tool.harness]` in pyproject.toml > the default here.
"""

from __future__ import annotations

import copy
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from harness.core.backend_names import CUDA_ONLY, EVERY_DEVICE
from harness.core.errors import HarnessError
from harness.core.layouts import DEFAULT_LAYOUTS, FULL_LAYOUTS


@dataclass(frozen=True)
class Option:
    name: str
    default: Any
    help: str
    is_list: bool = False
    is_table: bool = False  # a TOML table per dtype (`[tool.harness.tolerance]`), merged key by key; no CLI flag
    choices: tuple[str, ...] = ()  # the valid values, where only a few are


def _option(default: Any, help: str, is_list: bool = False, is_table: bool = False, choices: tuple[str, ...] = ()):
    return field(default_factory=lambda: copy.deepcopy(default),
                 metadata={"help": help, "is_list": is_list, "is_table": is_table, "choices": choices})




@dataclass
class Settings:
    """Every option, declared once: a CLI flag (`--case-timeout`), a pytest option (`--harness-case-timeout`) and a
    `[tool.harness]` key (`case_timeout`) each. `root` is the folder relative paths are taken from."""

    plan: str = _option("quick", "Preset for the options not given: quick (CI) or full (everything).",
                        choices=("quick", "full"))
    models: list[str] = _option(["flux", "flux2", "qwenimage"], "Models of the zoo to run, comma-separated.", True)
    kinds: list[str] = _option(["tensor", "image", "train"], "tensor (one forward), image (a whole pipeline), train "
                                                              "(a few training steps).", True)
    weights: str | None = _option(None, "A local diffusers checkpoint folder to run the image cases on (never the "
                                        "hub).")
    shapes: list[str] = _option(["default", "masked"], "Input shapes per model (default, txt7, img15, masked, ...) "
                                                       "or 'all'; a model runs those it has.", True)
    layouts: list[str] = _option(list(DEFAULT_LAYOUTS), "Parallel layouts, e.g. ulysses2,ring2,ring2xulysses2,tp2.",
                                 True)
    backends: list[str] = _option(list(EVERY_DEVICE), "Attention backends to run.", True)
    dtypes: list[str] = _option(["fp32", "bf16"], "Dtypes to run (fp32, bf16, fp16), comma-separated.", True)
    train_models: list[str] | None = _option(None, "Models the train kind runs (default: those of --models).", True)
    train_layouts: list[str] | None = _option(None, "Layouts the train kind runs, dpN and dpNx<cp> included "
                                                    "(default: those of --layouts).", True)
    train_shapes: list[str] | None = _option(None, "Shapes the train kind runs (default: those of --shapes).", True)
    train_steps: int = _option(3, "Optimizer steps a train case runs (and its reference holds).")
    train_noise_factor: float = _option(2.0, "Low-precision train cases: most each gradient and the loss may be of "
                                             "the largest error of five single-device draws of their dtype's noise.")
    train_exact: bool = _option(False, "fp32 train cases must reproduce the reference's losses bit for bit, as "
                                       "torchtitan's loss comparison demands of deterministic runs.")
    references: str = _option("references", "Directory of the captured fp32 references.")
    report_dir: str = _option("reports", "Directory where matrix.csv, matrix.md and results.json are written.")
    known_issues: str = _option("known_issues.toml", "TOML file of known failures that become XFAIL.")
    case_timeout: float = _option(0.0, "Seconds a case may run before it is TIMEOUT (0: 300 s + 60 s per GB of "
                                       "weights).")
    check_refusals: bool = _option(False, "Run the cases diffusers is expected to refuse (backend not "
                                          "context-parallel capable, uneven split) to see it refuse, instead of SKIP.")
    cpu_max_ranks: int = _option(4, "Most ranks a CPU-only machine runs; larger layouts are SKIP.")
    budget_factor: float = _option(1.25, "Low precision: most a layout may multiply the dtype's own mean error by.")
    budget_max_factor: float = _option(1.5, "Low precision: most a layout may multiply the dtype's own max error by.")
    localize: bool = _option(False, "Find where every case that ran breaks (the first module whose output leaves "
                                    "the single-device run's), not only the FAIL cases.")
    allow_no_parallel: bool = _option(False, "Exit 0 even when no case with more than one rank ran (by default "
                                             "such a run exits 1: it checked no parallel layout).")
    xfail_strict: bool = _option(False, "A known issue that no longer reproduces (XPASS) fails the run, as pytest's "
                                        "xfail_strict: its entry must then be removed or narrowed.")
    images: str = _option("failing", "PNGs an image case keeps: failing (all four for FAIL/ERROR/TIMEOUT, one "
                                     "thumbnail otherwise) or all (reference, candidate, difference, SSIM map).",
                          choices=("failing", "all"))
    tolerance: dict[str, float] = _option(
        {"fp32": 1e-5, "bf16": 0.15, "fp16": 2e-2},
        "Tensor cases: max abs error against the fp32 reference, per dtype.", is_table=True)
    # Limits for the tiny pipelines (64x64, 2 steps), from benchmarks/image_separation.py: correct layouts measure
    # fp32 SSIM 1 - 1e-12, PSNR >= 110 dB, max <= 1e-5; bf16 (vs the fp32 and the bf16 single-device picture) SSIM
    # >= 0.9991, PSNR >= 46.5 dB, max <= 0.039; broken layouts SSIM <= 0.86, PSNR <= 25.3 dB, max >= 0.27 in every
    # dtype (SSIM <= 0.921, PSNR <= 29.9 dB over 8 latent seeds). Each limit sits between the two, in ratio terms.
    image: dict[str, dict[str, float]] = _option(
        {"fp32": {"ssim_min": 0.9999, "psnr_min": 60.0, "max_abs_err_max": 5e-3},
         "bf16": {"ssim_min": 0.99, "psnr_min": 38.0, "max_abs_err_max": 0.10},
         "fp16": {"ssim_min": 0.999, "psnr_min": 45.0, "max_abs_err_max": 0.03}},
        "Image cases: SSIM, PSNR and max pixel error limits per dtype.", is_table=True)
    # Train cases, fp32, from clean layouts of flux and qwenimage (3 AdamW steps): loss rel err <= 1.1e-7, each
    # parameter's gradient rel L2 err <= 1e-6, weights <= 1.3e-5 (helios_amplify's dp2 1.9e-4: AdamW turns the noise
    # of a near-zero gradient into a step of up to the learning rate); a ring4 backward that sends gradients the wrong
    # way measures loss 3e-4, gradients 1.0, weights 6e-3. Low precision has no fixed limit: the noise of its own
    # dtype, measured on one device in every run, sets them (harness/kinds/train.py).
    train_tolerance: dict[str, dict[str, float]] = _option(
        {"fp32": {"loss_rel": 1e-5, "grad_rel": 1e-4, "weight_abs": 1e-3}},
        "Train cases, fp32: loss rel err, each gradient's rel L2 err and the weights' max abs err after the last step.",
        is_table=True)
    launcher: str = _option("local", "How ranks start: local (torchrun on this host), torchrun (multi-node c10d "
                                     "rendezvous; run the same command on every node) or slurm (srun, or an sbatch "
                                     "script with --slurm-script).", choices=("local", "torchrun", "slurm"))
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

    @property
    def values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in OPTIONS}

    def path(self, name: str) -> Path:
        value = Path(getattr(self, name))
        return value if value.is_absolute() else self.root / value

    def tolerance_for(self, dtype: str) -> float:
        return self.tolerance[dtype]

    def image_limit(self, dtype: str) -> dict[str, float]:
        return self.image[dtype]

    def kind_scope(self, kind: str) -> tuple[list[str], list[str], list[str]]:
        """The models, layouts and shapes a kind runs: its own `<kind>_models` / `_layouts` / `_shapes` where it has
        them (train), else --models, --layouts and --shapes."""
        return (getattr(self, f"{kind}_models", None) or self.models,
                getattr(self, f"{kind}_layouts", None) or self.layouts,
                getattr(self, f"{kind}_shapes", None) or self.shapes)

    @property
    def scopes(self) -> dict[str, tuple[list[str], list[str], list[str]]]:
        return {kind: self.kind_scope(kind) for kind in self.kinds}


OPTIONS = {
    f.name: Option(f.name, f.default_factory(), f.metadata["help"], f.metadata["is_list"], f.metadata["is_table"],
                   f.metadata["choices"])
    for f in fields(Settings) if f.metadata.get("option", True)
}

# The options `harness run` and the pytest plugin take as flags (capture and selftest take subsets).
RUN_OPTIONS = tuple(name for name, option in OPTIONS.items() if not option.is_table)

QUICK_TRAIN_LAYOUTS = ["ulysses2", "ring2", "ring4", "ring2xulysses2", "tp2", "dp2", "dp2xulysses2"]

PLANS = {
    "quick": {"train_models": ["flux", "qwenimage"], "train_layouts": QUICK_TRAIN_LAYOUTS, "train_shapes": ["default"]},
    "full": {
        "models": "all",
        "shapes": ["all"],
        "layouts": list(FULL_LAYOUTS),
        "backends": [*EVERY_DEVICE, *CUDA_ONLY],
        "dtypes": ["fp32", "bf16", "fp16"],
        "check_refusals": True,
    },
}


def find_pyproject(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.exists():
            return candidate
    return None


def load_settings(overrides: dict[str, Any] | None = None, start: Path | None = None) -> Settings:
    """Defaults, then `[tool.harness]`, then the non-None `overrides` (from the CLI or pytest)."""
    start = (start or Path.cwd()).resolve()
    pyproject = find_pyproject(start)
    table: dict[str, Any] = {}
    if pyproject is not None:
        try:
            table = tomllib.loads(pyproject.read_text()).get("tool", {}).get("harness", {})
        except tomllib.TOMLDecodeError as error:
            raise HarnessError(f"{pyproject}: invalid TOML ({error})") from None
    root = pyproject.parent if pyproject is not None else start
    values = {name: option.default for name, option in OPTIONS.items()}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in OPTIONS:
            raise HarnessError(f"{pyproject}: unknown key [tool.harness] {key!r}; valid keys: {', '.join(OPTIONS)}")
        values[name] = _merged(OPTIONS[name], values[name], value, pyproject) if OPTIONS[name].is_table else value
    overrides = {key: value for key, value in (overrides or {}).items() if value is not None}
    plan = overrides.get("plan", values["plan"])
    if plan not in PLANS:
        raise HarnessError(f"unknown plan {plan!r}; valid plans: {', '.join(OPTIONS['plan'].choices)}")
    explicit = {key.replace("-", "_") for key in table} | set(overrides)
    preset = {key: value for key, value in PLANS[plan].items() if key not in explicit}
    for key, value in {**preset, **overrides}.items():
        values[key] = split_list(value) if OPTIONS[key].is_list else value
    for given, own in (("models", "train_models"), ("layouts", "train_layouts"), ("shapes", "train_shapes")):
        if given in explicit and own not in explicit:  # `--models wan --kinds train` trains wan
            values[own] = None
    for key, value in values.items():
        values[key] = _typed(OPTIONS[key], value, pyproject)
    for name, option in OPTIONS.items():
        if option.choices and values[name] not in option.choices:
            raise HarnessError(f"option {name}: {values[name]!r} is not one of {', '.join(option.choices)}")
    for key in ("models", "train_models"):
        if values[key] == ["all"]:
            from harness.catalogue.zoo import SPECS

            values[key] = list(SPECS)
    return Settings(**values, root=root)


def _merged(option: Option, default: dict, given: Any, pyproject) -> dict:
    """A table option: the default per dtype, with the keys `[tool.harness.<name>]` gives replaced (as numbers)."""
    if not isinstance(given, dict):
        raise HarnessError(f"{pyproject}: [tool.harness] {option.name} must be a table, e.g. "
                           f"[tool.harness.{option.name}]")
    merged = copy.deepcopy(default)
    for dtype, value in given.items():
        try:
            if isinstance(value, dict):
                merged[dtype] = {**merged.get(dtype, {}), **{key: float(v) for key, v in value.items()}}
            else:
                merged[dtype] = float(value)
        except (TypeError, ValueError):
            raise HarnessError(f"{pyproject}: [tool.harness.{option.name}] {dtype}: {value!r} is not a number") \
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
