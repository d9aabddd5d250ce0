"""Every option declared once: CLI flags, pytest options and `[tool.harness]` keys share this table.

Precedence: command line > `[tool.harness]` in pyproject.toml > the default here.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.layouts import DEFAULT_LAYOUTS, FULL_LAYOUTS


@dataclass(frozen=True)
class Option:
    name: str
    default: Any
    help: str
    is_list: bool = False


OPTIONS = {
    option.name: option
    for option in (
        Option("plan", "quick", "Preset for the options not given: quick (CI) or full (everything)."),
        Option("models", ["flux", "flux2", "qwenimage"], "Models of the zoo to run, comma-separated.", True),
        Option("kinds", ["tensor", "image"], "tensor (one forward) and/or image (a whole pipeline).", True),
        Option("weights", None, "A local diffusers checkpoint folder to run the image cases on (never the hub)."),
        Option("shapes", ["default", "masked"],
               "Input shapes per model (default, txt7, img15, masked, ...) or 'all'; a model runs those it has.", True),
        Option("layouts", list(DEFAULT_LAYOUTS), "Parallel layouts, e.g. ulysses2,ring2,ring2xulysses2,tp2.", True),
        Option("backends", ["native", "_native_math", "_native_flash", "flex"], "Attention backends to run.", True),
        Option("dtypes", ["fp32", "bf16"], "Dtypes to run (fp32, bf16, fp16), comma-separated.", True),
        Option("references", "references", "Directory of the captured fp32 references."),
        Option("report_dir", "reports", "Directory where matrix.csv, matrix.md and results.json are written."),
        Option("known_issues", "known_issues.toml", "TOML file of known failures that become XFAIL."),
        Option("case_timeout", 0.0, "Seconds a case may run before it is TIMEOUT (0: 300 s + 60 s per GB of weights)."),
        Option("check_refusals", False, "Run the cases diffusers is expected to refuse (backend not context-parallel "
                                        "capable, uneven split) to see it refuse, instead of SKIP."),
        Option("cpu_max_ranks", 4, "Most ranks a CPU-only machine runs; larger layouts are SKIP."),
        Option("budget_factor", 1.25, "Low precision: most a layout may multiply the dtype's own error by."),
    )
}

# The options `harness run` and the pytest plugin accept (capture and selftest take subsets).
RUN_OPTIONS = ("plan", "models", "kinds", "weights", "shapes", "layouts", "backends", "dtypes", "references",
               "report_dir", "known_issues", "case_timeout", "check_refusals", "cpu_max_ranks", "budget_factor")

GPU_BACKENDS = ["_native_cudnn", "_native_efficient", "flash", "_flash_3", "sage", "xformers"]
PLANS = {
    "quick": {},
    "full": {
        "models": "all",
        "shapes": ["all"],
        "layouts": list(FULL_LAYOUTS),
        "backends": ["native", "_native_math", "_native_flash", "flex", *GPU_BACKENDS],
        "dtypes": ["fp32", "bf16", "fp16"],
        "check_refusals": True,
    },
}

DEFAULT_TOLERANCES = {"fp32": 1e-5, "bf16": 0.15, "fp16": 2e-2}


@dataclass
class Settings:
    values: dict[str, Any]
    tolerances: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    root: Path = Path(".")
    image_limits: dict[str, dict[str, float]] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def path(self, name: str) -> Path:
        value = Path(self.values[name])
        return value if value.is_absolute() else self.root / value

    def tolerance(self, dtype: str) -> float:
        return self.tolerances[dtype]

    def image_limit(self, dtype: str) -> dict[str, float]:
        from harness.image_metrics import THRESHOLDS

        return {**THRESHOLDS[dtype], **self.image_limits.get(dtype, {})}


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
    tolerances, image_limits = dict(DEFAULT_TOLERANCES), {}
    for key, value in table.items():
        if key == "tolerance":
            tolerances.update({dtype: float(v) for dtype, v in value.items()})
        elif key == "image":
            image_limits = {dtype: {k: float(v) for k, v in limits.items()} for dtype, limits in value.items()}
        elif key.replace("-", "_") in OPTIONS:
            values[key.replace("-", "_")] = value
        else:
            raise HarnessError(f"{pyproject}: unknown key [tool.harness] {key!r}; valid keys: {', '.join(OPTIONS)}")
    overrides = {key: value for key, value in (overrides or {}).items() if value is not None}
    plan = overrides.get("plan", values["plan"])
    if plan not in PLANS:
        raise HarnessError(f"unknown plan {plan!r}; valid plans: {', '.join(PLANS)}")
    for key, value in {**PLANS[plan], **overrides}.items():
        values[key] = split_list(value) if OPTIONS[key].is_list else value
    for key, value in values.items():
        values[key] = _typed(OPTIONS[key], value, pyproject)
    if values["models"] == ["all"]:
        from harness.zoo import SPECS

        values["models"] = list(SPECS)
    return Settings(values, tolerances, root, image_limits)


def _typed(option: Option, value: Any, pyproject) -> Any:
    """Values from pytest options and TOML arrive as text or another type; give each the type of its default."""
    kind = type(option.default)
    if option.is_list or option.default is None or value is None or isinstance(value, kind):
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
