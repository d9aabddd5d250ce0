"""How a case's model runs: eager as written, or compiled by torch.compile (the `mode` axis, harness.core.axes).

Declared here once, torch-free: the plan checks the names, the rank compiles by them (harness.rank.compiled).
Compiling costs far more than running on the tiny zoo (tens of seconds to minutes a graph on a CPU, docs/compile.md),
so a compiled mode runs only a plan's compile slice (`compile_cases`, harness.run.settings) unless `--modes all`.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.core import axes

EAGER = "eager"


@dataclass(frozen=True)
class Mode:
    name: str
    help: str
    backend: str | None = None  # torch.compile's backend (None: eager)
    regional: bool = False  # compile each of the model's `_repeated_blocks` instead of the whole model
    # times the case timeout: Inductor compiles a tiny case's forward and backward in 10 to 60 s on 2 quiet cores,
    # and over 300 s on a loaded one (a CI test suite beside a run); a hang is still caught by the stall detector
    timeout_factor: float = 1.0


MODES = {mode.name: mode for mode in (
    Mode(EAGER, "as written, no compilation"),
    Mode("compile", "torch.compile of the whole model, Inductor (what users run for speed)", "inductor",
         timeout_factor=6.0),
    Mode("regional", "diffusers' compile_repeated_blocks: each repeated block compiled by Inductor", "inductor",
         regional=True, timeout_factor=6.0),
    Mode("aot_eager", "torch.compile with the aot_eager backend: Dynamo and AOTAutograd, no Inductor (a cheap "
                      "diagnostic: it tells a tracing bug from a code-generation one)", "aot_eager",
         timeout_factor=3.0),
)}


def mode_of(name: str) -> Mode:
    from harness.core.errors import HarnessError

    if name not in MODES:
        raise HarnessError(f"unknown mode {name!r}; valid modes: {', '.join(MODES)}, or all (every mode, every case)")
    return MODES[name]


def eager_id(case_id: str) -> tuple[str, str]:
    """A case id without its mode (a negative control's fault stays), and the mode: the id of the case's eager twin."""
    values = axes.parse(case_id)
    return axes.spell({**values, "mode": EAGER}, values["fault"]), values["mode"]
