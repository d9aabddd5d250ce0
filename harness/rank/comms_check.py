"""Communication proof, the prediction and the check: what a layout must make each module communicate.

Derived from the layout, the model's module tree and its plans, never from the run it judges:
- context parallelism: `enable_parallelism` hands every attention module's processor the CP config, so every call
  of an attention module over split keys exchanges data: Ulysses (degree > 1) all-to-alls its q, k, v and output
  (4 per call), the ring (degree > 1) all-gathers the K/V buffer that serves all its steps (1 per call); ring x
  Ulysses does both. A cross-attention call (given `encoder_hidden_states`) when the plan splits no input of that
  name attends to keys whole on every rank and needs no exchange (Wan's processors pass it no CP config);
- every gather point of the `_cp_plan` (a `ContextParallelOutput`): one all-gather per gathered output per call;
- tensor parallelism: every row-wise layer of the `_tp_plan` all-reduces its partial sums (1 per call);
- PyTorch's context parallelism (tcp layouts): every attention call goes through PyTorch's ring, whose all-gather
  rotation gathers the K/V buffer once (1 all-gather per call) and whose all-to-all rotation passes it on degree - 1
  times (`permute_tensor`, an all-to-all each).
These are minimums: a module may communicate more (an attention mask all-gathered under Ulysses, the sizes exchanged
by `*any` layouts, an LSE all-to-all); what it may not do is skip what its layout needs.

A run with a backward (a train case) must communicate in it too, all under `(backward)` (the recorder cannot tell
which module's backward runs): Ulysses sends each attention call's gradients back the way its forward sent q, k, v
and the output (4 all-to-alls a call); the ring passes the K/V gradients around the ring (degree - 1 all-to-alls a
call, `permute_tensor`; its K/V buffer it gathers again in eager, while a compiled backward may keep the forward's);
tensor parallelism all-reduces the input gradients of its column-wise layers (at least one). PyTorch's own ring's
backward is not predicted.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import asdict, dataclass

from harness.catalogue.attention import attention_classes
from harness.rank.comms import CONTEXT
from harness.rank.recorder import BACKWARD

ULYSSES_PER_CALL = 4  # q, k, v before the attention, its output after


@dataclass(frozen=True)
class Expectation:
    """At least `at_least` `collective`s inside `module` (its own and its submodules'), and why."""

    module: str
    collective: str
    at_least: int
    why: str

    def to_dict(self) -> dict:
        return asdict(self)


def _matches(key: str, names) -> list[str]:
    """Module names a plan key names; `*` stands for one index of a ModuleList, as in diffusers' plans."""
    pattern = re.compile(re.escape(key).replace(r"\*", r"\d+") + r"\Z")
    return [name for name in names if pattern.match(name)]


def _gathered_outputs(value) -> int:
    """How many outputs a `_cp_plan` entry gathers (inputs are dicts; outputs a ContextParallelOutput or a list)."""
    if isinstance(value, dict):
        return 0
    items = value if isinstance(value, (list, tuple)) else [value]
    return sum(1 for item in items if hasattr(item, "gather_dim"))


def _is_rowwise(style) -> bool:
    return style == "rowwise" or type(style).__name__ == "PackedRowwiseParallel"


def predict(model, layout, cp_plan: dict | None, recorder, backward: bool = False) -> list[Expectation]:
    """What `layout` must make each called module of `model` communicate (`recorder`: its calls per module), and
    with `backward` what the backward of the run must."""
    expected, calls = [], recorder.calls
    if layout.is_context_parallel:
        plan = cp_plan if cp_plan is not None else getattr(model, "_cp_plan", None) or {}
        split = {name for value in plan.values() if isinstance(value, dict) for name in value}
        whole_context = {} if CONTEXT in split else recorder.context_calls
        attention = _attention(model, layout, {name: n - whole_context.get(name, 0) for name, n in calls.items()})
        expected += attention + (_attention_backward(attention, layout) if backward else [])
        for key, value in plan.items():
            per_call = _gathered_outputs(value)
            for name in _matches(key, calls) if per_call else []:
                expected.append(Expectation(name, "all_gather", per_call * calls[name],
                                            f"{calls[name]} call(s) of a _cp_plan gather point"))
    if layout.is_torch_context_parallel:
        expected += _torch_ring(model, layout, calls)
    if layout.tp > 1:
        plan = getattr(model, "_tp_plan", None) or {}
        for key, style in plan.items():
            for name in _matches(key, calls) if _is_rowwise(style) else []:
                expected.append(Expectation(name, "all_reduce", calls[name],
                                            f"{calls[name]} call(s) of a _tp_plan row-wise layer (partial sums)"))
        columns = sum(calls[name] for key, style in plan.items() if not _is_rowwise(style)
                      for name in _matches(key, calls))
        if backward and columns:
            expected.append(Expectation(BACKWARD, "all_reduce", 1, f"{columns} call(s) of _tp_plan column-wise "
                                                                   "layers: their input gradients' partial sums"))
    return expected


def _attention_backward(forward: list[Expectation], layout) -> list[Expectation]:
    """The backward's share of the attention calls' exchanges (all under BACKWARD)."""
    calls = sum(item.at_least for item in forward if item.collective == "all_gather")  # the ring: one a call
    to_all = sum(item.at_least for item in forward if item.collective == "all_to_all")  # Ulysses: four a call
    expected = []
    if layout.ulysses > 1 and to_all:
        expected.append(Expectation(BACKWARD, "all_to_all", to_all, f"Ulysses: the gradients of {to_all // 4} "
                                                                    "attention call(s) sent back (q, k, v, output)"))
    if layout.ring > 1 and calls:  # its K/V buffer it may gather again (eager) or keep from the forward (compiled)
        expected.append(Expectation(BACKWARD, "all_to_all", (layout.ring - 1) * calls,
                                    f"ring: the K/V gradients of {calls} attention call(s) passed on"))
    return expected


def _attention(model, layout, calls: dict[str, int]) -> list[Expectation]:
    """`calls`: each module's calls over split keys."""
    classes, expected = attention_classes(), []
    for name, module in model.named_modules():
        if not isinstance(module, classes) or calls.get(name, 0) <= 0:
            continue
        n = calls[name]
        if layout.ulysses > 1:
            expected.append(Expectation(name, "all_to_all", ULYSSES_PER_CALL * n,
                                        f"{n} attention call(s) over split keys, Ulysses: q, k, v and output"))
        if layout.ring > 1:
            expected.append(Expectation(name, "all_gather", n,
                                        f"{n} attention call(s) over split keys, ring: the K/V exchange"))
    return expected


def _torch_ring(model, layout, calls: dict[str, int]) -> list[Expectation]:
    """PyTorch's ring, for every called attention module: its K/V exchange per call, by rotation method."""
    collective, per_call = ("all_to_all", layout.torch_cp - 1) if layout.rotate == "alltoall" else ("all_gather", 1)
    return [Expectation(name, collective, per_call * calls[name],
                        f"{calls[name]} attention call(s) through PyTorch's ring, {layout.rotate} rotation: the K/V "
                        f"exchange")
            for name, module in model.named_modules()
            if isinstance(module, attention_classes()) and calls.get(name, 0) > 0]


def inclusive(recorded: dict[str, dict[str, list[int]]], module: str, collective: str) -> int:
    """Collectives of `module` and of its submodules (recorded at the innermost module that ran them)."""
    prefix = f"{module}." if module else ""
    return sum(row.get(collective, (0, 0))[0] for name, row in recorded.items()
               if name == module or (name.startswith(prefix) and not name.startswith("(")))


@dataclass(frozen=True)
class Shortfall:
    """A module that ran fewer of a collective than its layout predicts: `got` of `at_least`, and why."""

    module: str
    collective: str
    got: int
    at_least: int
    why: str

    @property
    def text(self) -> str:
        return f"{self.module or '(model)'}: {self.got} {self.collective}, expected >= {self.at_least} ({self.why})"


def shortfalls(expected: list[dict], recorded: dict | None) -> tuple[list[Shortfall], int]:
    """Each predicted exchange the recorded collectives fall short of, in the prediction's order, and how many
    (module, collective) minimums were predicted; nothing when there is no recording or no prediction."""
    if recorded is None or not expected:
        return [], 0
    needed: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for item in expected:
        needed[item["module"], item["collective"]].append(item)
    short = []
    for (module, collective), items in needed.items():
        at_least, got = sum(item["at_least"] for item in items), inclusive(recorded, module, collective)
        if got < at_least:
            short.append(Shortfall(module, collective, got, at_least, " + ".join(item["why"] for item in items)))
    return short, len(needed)


def comms_mismatch(expected: list[dict], recorded: dict | None, shown: int = 3) -> str | None:
    """Why the recorded collectives do not prove the layout's communication; None when every minimum is met."""
    short, predicted = shortfalls(expected, recorded)
    if not short:
        return None
    more = f"; and {len(short) - shown} more" if len(short) > shown else ""
    return (f"{MISSING.format(len(short), predicted)}{'; '.join(item.text for item in short[:shown])}{more}")


MISSING = "communication: {} of {} predicted exchanges missing: "  # how a communication proof's failure begins


# --- views: the matrix column and the case detail -------------------------------------------------------------------


def totals(recorded: dict[str, dict[str, list[int]]]) -> str:
    """The `comms` column: each collective's count over the run, and the bytes this rank put into them all."""
    counts: dict[str, int] = defaultdict(int)
    size = 0
    for row in recorded.values():
        for collective, (count, nbytes) in row.items():
            counts[collective] += count
            size += nbytes
    if not counts:
        return "none"
    return " ".join(f"{name}:{count}" for name, count in sorted(counts.items())) + f" ({_size(size)})"


def _size(nbytes: int) -> str:
    for unit, scale in (("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


def by_pattern(recorded: dict[str, dict[str, list[int]]], expected: list[dict]) -> list[dict]:
    """The case detail's table, one row per module pattern (`transformer_blocks.*.attn`: the block index folded,
    counts and bytes summed over its modules): what ran at those modules and the minimum predicted for them (met by
    them or their submodules, as checked). A missing exchange is named module by module in the FAIL reason."""
    rows: dict[str, dict] = {}

    def row(module: str) -> dict:
        pattern = re.sub(r"(?<![^.])\d+(?![^.])", "*", module, count=1)  # the block index
        return rows.setdefault(pattern, {"modules": pattern, "count": set(), "recorded": defaultdict(lambda: [0, 0]),
                                         "expected": defaultdict(int)})

    for module, collectives in recorded.items():
        entry = row(module)
        entry["count"].add(module)
        for collective, (count, nbytes) in collectives.items():
            entry["recorded"][collective][0] += count
            entry["recorded"][collective][1] += nbytes
    for item in expected:
        entry = row(item["module"])
        entry["count"].add(item["module"])
        entry["expected"][item["collective"]] += item["at_least"]
    return [{"modules": e["modules"] or "(model)", "count": len(e["count"]), "recorded": dict(e["recorded"]),
             "expected": dict(e["expected"])} for _, e in sorted(rows.items())]
