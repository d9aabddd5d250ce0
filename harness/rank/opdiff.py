"""Per-op numerics inside one module: every aten op its forward runs, in order, each op's output and tensor inputs
fingerprinted (harness.rank.fingerprint), recorded under a TorchDispatchMode entered as the module starts and left as
it ends; and, between two such records of the same module (two revisions, or a change and the code without it), the
first op that differs, with its inputs' and output's figures."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.rank import fingerprint

MOST_INPUTS = 4  # tensor inputs fingerprinted per op (an op's first ones: what it computes from)


class _Ops(TorchDispatchMode):
    def __init__(self, found: list[dict]):
        super().__init__()
        self.found = found

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        output = func(*args, **(kwargs or {}))
        tensors = [value for value in (*args, *(kwargs or {}).values()) if isinstance(value, torch.Tensor)]
        result = fingerprint.first_tensor(output)
        self.found.append({"op": str(func.overloadpacket.__name__) + "." + func._overloadname,
                           "out": None if result is None else fingerprint.fingerprint(result).tolist(),
                           "ins": [fingerprint.fingerprint(tensor).tolist() for tensor in tensors[:MOST_INPUTS]]})
        return output


def record(model: torch.nn.Module, target: str, run: Callable[[], object]) -> list[dict]:
    """The ops of the first call of `model`'s module `target` while `run()` runs (no gradient): [{"op", "out",
    "ins"}] in the order they ran."""
    found, modes = [], []
    module = model.get_submodule(target.split("#")[0])

    def enter(*_):
        if not modes and not found:
            modes.append(_Ops(found))
            modes[0].__enter__()

    def leave(*_):
        if modes:
            modes.pop().__exit__(None, None, None)

    handles = [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        with torch.no_grad():
            run()
    finally:
        leave()
        for handle in handles:
            handle.remove()
    return found


def first_difference(mine: list[dict], theirs: list[dict], limit: float = fingerprint.RESOLUTION) -> dict | None:
    """The first op of `mine` whose output differs from the same op of `theirs` by more than `limit` (relative), or
    where the two sequences of ops part; None when every op agrees."""
    for index, (op, other) in enumerate(zip(mine, theirs, strict=False)):
        if op["op"] != other["op"]:
            return {"index": index, "op": op["op"], "theirs": other["op"], "count": len(mine)}
        if op["out"] is None or other["out"] is None:
            continue
        output = _difference(op["out"], other["out"])
        if output > limit:
            inputs = [_difference(a, b) for a, b in zip(op["ins"], other["ins"], strict=False)]
            return {"index": index, "op": op["op"], "output": output, "inputs": inputs, "count": len(mine)}
    if len(mine) != len(theirs):
        longer = mine if len(mine) > len(theirs) else theirs
        return {"index": min(len(mine), len(theirs)), "op": "(end)", "count": len(mine),
                "lengths": (len(mine), len(theirs)), "extra": longer[min(len(mine), len(theirs))]["op"]}
    return None


def line(found: dict | None, module: str) -> str:
    """`aten.mul.Tensor, op 37 of 112 inside transformer_blocks.0.attn: output rel err 1.0e+00 (its inputs 0.0e+00,
    0.0e+00)`, or where the two sequences part, or that every op agrees."""
    if found is None:
        return f"every op inside {module} agrees"
    where = f"op {found['index'] + 1} of {found['count']} inside {module}"
    if "lengths" in found:
        more = "here" if found["lengths"][0] > found["lengths"][1] else "on the other side"
        return f"the ops inside {module} agree as far as both go ({min(found['lengths'])}), then {more} runs " \
               f"aten.{found['extra']} and {abs(found['lengths'][0] - found['lengths'][1]) - 1} more"
    if "theirs" in found:
        return f"the ops part at {where}: aten.{found['op']} here, aten.{found['theirs']} on the other side"
    inputs = ", ".join(f"{value:.1e}" for value in found["inputs"]) or "none"
    return f"aten.{found['op']}, {where}: output rel err {found['output']:.1e} (its inputs {inputs})"


def _difference(mine: list[float], theirs: list[float]) -> float:
    return fingerprint.difference(torch.tensor(mine, dtype=torch.float64), torch.tensor(theirs, dtype=torch.float64))
