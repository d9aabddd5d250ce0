"""Where a layout breaks: every module's output under the layout against the same module on one device, in execution
order, and the first one that diverges.

Each rank records its modules' outputs (forward hooks, in the order the modules finish, so a module comes before
the block that holds it). Rank 0 receives every rank's record and puts each output back together as a correct
layout would hold it: a DTensor is gathered by PyTorch; a tensor every rank holds alike is taken once; a sequence
shard (context parallel, even or uneven) or a head/feature shard (tensor parallel; diffusers' packed projections
put back in the model's order) is concatenated in rank order along the one dimension whose sizes add up to the
single-device output's; a tensor of the full shape the ranks hold differently (a row-parallel layer that skipped
its all-reduce) is compared as rank 0 holds it, which is where a correct layout would hold the sum. An output that
fits none of these is reported as such, never skipped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
import torch.distributed as dist

from harness.core.records import ModuleTrace

# Relative to the largest value of the single-device module output. fp32: a clean flux tp2 measures at most 5.6e-7,
# and the whole quick plan under --localize names no module at 1e-4 (docs/localization.md); low precision: the
# same dtype on one device sets the scale.
FP32_LIMIT = 1e-4
LOW_PRECISION_FACTOR = 4.0
LOW_PRECISION_FLOOR = 1e-3


def first_tensor(output) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return next((found for item in output if (found := first_tensor(item)) is not None), None)
    if hasattr(output, "sample"):
        return first_tensor(output.sample)
    return None


def trace(module, run: Callable[[], object], compiled: bool = False) -> list[tuple[str, torch.Tensor,
                                                                                   torch.Tensor | None]]:
    """(name, output, first input) of every submodule call of `module` while `run()` runs, in the order the calls
    finish; a module called again is `name#2`, `name#3`... `compiled`: parts of `module` are compiled, and each
    hook runs eager where it is called (a graph break of its own), so a compiled module's output is what its
    compiled code computed."""
    records, handles = _forward_hooks(module, compiled)
    _run_without_grad(run, handles)
    return records


def _run_without_grad(run: Callable[[], object], handles: list) -> None:
    """One forward under `no_grad` with the hooks in `handles`, removed afterwards whatever happens."""
    try:
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()


def trace_backward(module, loss: Callable[[], torch.Tensor], scale: float = 1.0) -> tuple[list, list, list[str]]:
    """The forward records, and (name, input gradient, output gradient) of every module in the order its backward
    finishes: what a module's backward hands on is its "output" here, what it receives its "input", so the first
    module whose backward diverges is found as in the forward. `scale` brings a data-parallel rank's gradients, of
    its own batch's mean, to the whole batch's. Also the modules left out because a full backward hook on them
    breaks the backward itself (found on QwenImage under tensor parallelism: DTensor's redistribute backward then
    receives a plain tensor), each named by the localization."""
    distributed = _dtensor_modules(module, loss)  # full backward hooks cannot wrap DTensors: those are left out
    hooked = [name for name, _ in module.named_modules() if name and name not in distributed]
    try:
        return (*_traced_backward(module, loss, scale, hooked), [])
    except (AttributeError, RuntimeError):
        breaking = _breaking_hooks(module, loss, hooked)
        if not breaking:
            raise
    return (*_traced_backward(module, loss, scale, [name for name in hooked if name not in breaking]), breaking)


def _traced_backward(module, loss, scale: float, hooked: list[str]) -> tuple[list, list]:
    records, handles = _forward_hooks(module)
    grads, calls = [], Counter()
    for name in hooked:

        def hook(_module, grad_input, grad_output, name=name):
            given, received = first_tensor(list(grad_input)), first_tensor(list(grad_output))
            if given is None:
                return
            calls[name] += 1
            grads.append((name if calls[name] == 1 else f"{name}#{calls[name]}", _kept(given) * scale,
                          None if received is None else _kept(received) * scale))

        handles.append(module.get_submodule(name).register_full_backward_hook(hook))
    try:
        loss().backward()
    finally:
        for handle in handles:
            handle.remove()
        module.zero_grad(set_to_none=True)
    return records, grads


def _breaking_hooks(module, loss, names: list[str]) -> list[str]:
    """The modules among `names` whose full backward hook alone makes the backward fail, by halving (a few
    backward passes for one or two such modules among hundreds). Every rank runs the same passes in the same
    order, so their collectives pair up."""
    def survives(group: list[str]) -> bool:
        handles = [module.get_submodule(name).register_full_backward_hook(lambda *_: None) for name in group]
        try:
            loss().backward()
            return True
        except (AttributeError, RuntimeError):
            return False
        finally:
            for handle in handles:
                handle.remove()
            module.zero_grad(set_to_none=True)

    if not names or survives(names):
        return []
    if len(names) == 1:
        return names
    half = len(names) // 2
    return _breaking_hooks(module, loss, names[:half]) + _breaking_hooks(module, loss, names[half:])


def _dtensor_modules(module, run: Callable[[], object]) -> set[str]:
    """The modules that take or return a DTensor (tensor-parallel layers and what wraps their DTensor outputs), found
    by one forward."""
    found, handles = set(), []

    def is_dtensor(value) -> bool:
        if isinstance(value, (tuple, list)):
            return any(is_dtensor(item) for item in value)
        return hasattr(value, "full_tensor")

    for name, submodule in module.named_modules():
        if name:
            handles.append(submodule.register_forward_hook(
                lambda _m, args, kwargs, output, name=name: found.add(name)
                if is_dtensor(list(args) + list(kwargs.values())) or is_dtensor(output) else None, with_kwargs=True))
    _run_without_grad(run, handles)
    return found


def _forward_hooks(module, compiled: bool = False) -> tuple[list, list]:
    records, calls, handles = [], Counter(), []
    for name, submodule in module.named_modules():
        if not name:
            continue

        def hook(_module, args, kwargs, output, name=name):
            tensor = first_tensor(output)
            if tensor is None:
                return
            calls[name] += 1
            given = first_tensor(list(args) + list(kwargs.values()))
            records.append((name if calls[name] == 1 else f"{name}#{calls[name]}", _kept(tensor),
                            None if given is None else _kept(given)))

        handles.append(submodule.register_forward_hook(torch._dynamo.disable(hook) if compiled else hook,
                                                       with_kwargs=True))
    return records, handles


def _kept(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard as the rank holds it (put together with the others' on rank 0, in the model's order even
    for diffusers' packed layouts, which a DTensor's own gather gets wrong); a partial or replicated one whole
    (every rank records the same calls, so every rank gathers alike)."""
    if hasattr(tensor, "full_tensor"):
        sharded = any(placement.is_shard() for placement in tensor.placements)
        tensor = tensor.to_local() if sharded else tensor.full_tensor()
    return tensor.detach().float().cpu().clone()


def gather_records(records: list[tuple[str, torch.Tensor]], world_size: int) -> list[list] | None:
    """Every rank's record on rank 0 (None on the others)."""
    everything = [None] * world_size
    dist.all_gather_object(everything, records)
    return everything if dist.get_rank() == 0 else None


def assemble(pieces: list[torch.Tensor], expected: torch.Size, packed: tuple | None = None,
             streams: tuple[int, ...] = (), partial: bool = False) -> list[tuple[torch.Tensor | None, str]]:
    """The module output a correct layout holds, from each rank's piece: [(tensor, how)], or [(None, why not)].
    A joint sequence of separately split streams (Flux's text and image: each rank holds [text shard, image
    shard]) has one candidate per order of the `streams` lengths; the caller keeps the closest, since a broken
    module is far from all of them. A gradient (`partial`) of a tensor every rank holds whole is each rank's
    share when the ranks differ (each rank's own tokens or heads contributed to it): their sum."""
    first = pieces[0]
    if all(piece.shape == expected for piece in pieces):
        if all(torch.equal(piece, first) for piece in pieces[1:]):
            return [(first, "replicated")]
        if partial:
            return [(torch.stack(pieces).sum(0), "summed over the ranks (each rank's share)")]
        return [(first, "rank 0's (the ranks differ)")]
    dims = [d for d in range(len(expected)) if len(first.shape) == len(expected)
            and sum(piece.shape[d] for piece in pieces) == expected[d]
            and all(piece.shape[:d] + piece.shape[d + 1:] == expected[:d] + expected[d + 1:] for piece in pieces)]
    if len(dims) != 1:
        return [(None, f"cannot gather: pieces {[tuple(p.shape) for p in pieces]} for {tuple(expected)}")]
    dim = dims[0]
    whole = torch.cat(pieces, dim)
    if len({piece.shape[dim] for piece in pieces}) > 1:  # uneven (the *any layouts): one stream, in rank order
        streams = ()
    if packed is not None and dim == len(expected) - 1:
        from harness.rank.training import unpack

        whole = unpack(whole, dim, *packed)
    found = [(whole, f"concatenated along dim {dim}")]
    for order in _orders(streams, expected[dim], len(pieces)):
        parts = [torch.split(piece, [length // len(pieces) for length in order], dim) for piece in pieces]
        joined = torch.cat([parts[rank][s] for s in range(len(order)) for rank in range(len(pieces))], dim)
        found.append((joined, f"streams {'+'.join(map(str, order))} concatenated along dim {dim}"))
    return found


def _orders(streams: tuple[int, ...], total: int, degree: int) -> list[tuple[int, ...]]:
    """The stream lengths a joint sequence may be made of: the case's own split lengths in either order, else (a
    pipeline's lengths are its own) every even split into two streams."""
    from itertools import permutations

    if len(streams) >= 2 and sum(streams) == total and not any(length % degree for length in streams):
        return list(dict.fromkeys(permutations(streams)))
    if total % degree:
        return []
    return [(degree * k, total - degree * k) for k in range(1, total // degree)]


def relative_error(candidate: torch.Tensor, expected: torch.Tensor) -> float:
    if candidate.shape != expected.shape:
        return float("inf")
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    error = float((candidate.double() - expected.double()).abs().max()) if expected.numel() else 0.0
    if error != error:  # NaN
        return float("inf")
    return error / max(scale, 1e-6)


def localize(ranks: list[list], single: list, same_dtype: list | None, packed_outputs: dict[str, tuple],
             streams: tuple[int, ...] = (), gradients: bool = False, data_parallel: int = 1,
             called: set[str] | None = None) -> ModuleTrace:
    """Each module's error in the single-device execution order, and the first one above its limit: fp32 (no
    `same_dtype`) a fixed limit; low precision `LOW_PRECISION_FACTOR` x the same dtype's own error on one device,
    above a floor. When the first diverging module's input diverges already, the divergence arose in the module
    around it, between its children (an attention computed inside `attn`, first seen at its `to_out.0`; in backward
    a gradient already wrong when it reaches `attn.norm_q`): that module is named, with where it was first seen.
    `called`: the modules whose forward ran (the backward's own hooks miss a module called with keyword arguments
    only); `data_parallel`: groups of consecutive ranks that each hold their own samples."""
    by_rank = [{name: (output, given) for name, output, given in record} for record in ranks]
    own = {name: (output, given) for name, output, given in same_dtype} if same_dtype is not None else None
    rows, first = [], None
    for name, expected, expected_in in single:
        row = _row(name, expected, expected_in, [record.get(name) for record in by_rank], own, packed_outputs,
                   streams, gradients, data_parallel)
        rows.append(row)
        if first is None and row.get("error") is not None and not row["error"] <= row["limit"]:
            first = len(rows) - 1
    called = (called or set()) | {row["module"] for row in rows}
    uncompared = [row["module"] for row in rows if row.get("error") is None]
    return ModuleTrace(rows, first, first_line(rows, first, called), uncompared)


def summary(forward: ModuleTrace, backward: ModuleTrace | None = None, untraced: str | None = None) -> str:
    """The first divergence in one line, forward first, then backward (`backward: ...`), and what was not traced
    (`untraced`); never "none" when modules could not be compared (how many and which), nor when a backward that
    should have been traced was not."""
    more = f" ({untraced})" if untraced else ""
    found = _summary(forward, backward)
    if untraced and backward is None and found.startswith("none"):
        return f"not localized: {found.removeprefix('none: ')} in the forward; {untraced}"
    return found + more


def _summary(forward: ModuleTrace, backward: ModuleTrace | None) -> str:
    parts = [("", forward)] + ([("backward: ", backward)] if backward else [])
    for prefix, part in parts:
        if part.line is not None:
            return prefix + part.line + _uncompared(part)
    total = sum(len(part.modules) for _, part in parts)
    missed = [(prefix, name) for prefix, part in parts for name in part.uncompared]
    if total and len(missed) == total:
        why = next(row["how"] for _, part in parts for row in part.modules)
        return f"not localized: none of the {total} module outputs could be compared ({why})"
    if missed:
        shown = ", ".join(prefix + name for prefix, name in missed[:3])
        more = f" and {len(missed) - 3} more" if len(missed) > 3 else ""
        return (f"none within the {total - len(missed)} compared module outputs; {len(missed)} not compared "
                f"({shown}{more})")
    return "none: every module within its limit"


def _uncompared(part: ModuleTrace) -> str:
    """How many modules before the first divergence could not be compared (one of them may be where it began)."""
    before = [row["module"] for row in part.modules[:part.first] if row.get("error") is None]
    return f" ({len(before)} earlier module outputs not compared, e.g. {before[0]})" if before else ""


def _row(name, expected, expected_in, pieces, own, packed_outputs, streams, partial, data_parallel) -> dict:
    if any(piece is None for piece in pieces):
        return {"module": name, "error": None, "how": "not run under the layout"}
    error, how = _closest([piece[0] for piece in pieces], expected, packed_outputs.get(name.split("#")[0]), streams,
                          partial, data_parallel)
    if error is None:
        return {"module": name, "error": None, "how": how}
    limit, dtype_error = FP32_LIMIT, None
    if own is not None and name in own:
        dtype_error = relative_error(own[name][0], expected)
        limit = max(LOW_PRECISION_FACTOR * dtype_error, LOW_PRECISION_FLOOR)
    row = {"module": name, "error": error, "limit": limit, "how": how}
    if dtype_error is not None:
        row["dtype_error"] = dtype_error
    inputs = [piece[1] for piece in pieces]
    if expected_in is not None and all(given is not None for given in inputs):
        input_error, _ = _closest(inputs, expected_in, None, streams, partial, data_parallel)
        if input_error is not None:
            row["input_error"] = input_error
    return row


def _closest(pieces, expected, packed, streams, partial=False, data_parallel=1) -> tuple[float | None, str]:
    """The closest way the pieces make the expected tensor; data parallel: by sample, or (a tensor not split by
    sample whose first dimension merely divides) as one group holds it, whichever is closer."""
    by_samples = None
    if data_parallel > 1:
        by_samples = _closest_by_samples(pieces, expected, packed, streams, partial, data_parallel)
        pieces = _one_group(pieces, data_parallel, partial)
    candidates = assemble(pieces, expected.shape, packed, streams, partial)
    scored = [(relative_error(whole, expected), how) for whole, how in candidates if whole is not None]
    scored += [by_samples] if by_samples is not None else []
    return min(scored, key=lambda item: item[0]) if scored else (None, candidates[0][1])


def _one_group(pieces: list, groups: int, partial: bool) -> list:
    """A tensor not split by sample (a positional embedding) that every data-parallel group holds alike: one group's
    pieces; its gradient, which each group holds a share of (its samples'), the groups' sum. Otherwise all pieces,
    as they are."""
    size = len(pieces) // groups
    parts = [pieces[index * size:(index + 1) * size] for index in range(groups)]
    if size == 0 or any(len(part) != size or [p.shape for p in part] != [p.shape for p in parts[0]] for part in parts):
        return pieces
    if partial:
        return [torch.stack([part[index] for part in parts]).sum(0) for index in range(size)]
    if all(torch.equal(a, b) for part in parts[1:] for a, b in zip(part, parts[0], strict=True)):
        return parts[0]
    return pieces


def _closest_by_samples(pieces, expected, packed, streams, partial, groups: int) -> tuple[float, str] | None:
    """Data parallel: each group of consecutive ranks holds its own samples, the batch split along dim 0 (its
    context-parallel ranks the sequence of those samples). Each group's pieces are put together against its share
    of the batch, then the shares are joined; None when the output is not split by sample (the caller assembles it
    over all ranks: a tensor every rank holds alike, such as a positional embedding)."""
    if expected.dim() == 0 or expected.shape[0] % groups or len(pieces) % groups:
        return None
    size, share = len(pieces) // groups, expected.shape[0] // groups
    wholes, hows = [], []
    for index in range(groups):
        mine = expected[index * share:(index + 1) * share]
        candidates = [(whole, how) for whole, how in assemble(pieces[index * size:(index + 1) * size], mine.shape,
                                                              packed, streams, partial) if whole is not None]
        if not candidates:
            return None
        whole, how = min(candidates, key=lambda item: relative_error(item[0], mine))
        wholes.append(whole)
        hows.append(how)
    return relative_error(torch.cat(wholes), expected), (f"each of {groups} data-parallel groups' samples "
                                                         f"{hows[0]}, joined along dim 0")


def first_line(rows: list[dict], first: int | None, called: set[str]) -> str | None:
    """`transformer_blocks.1.attn: rel err 3.1e-02 > 1.0e-04 (previous 4.0e-07)`."""
    if first is None:
        return None
    row = rows[first]
    previous = next((r["error"] for r in reversed(rows[:first]) if r.get("error") is not None), None)
    before = f" (previous {previous:.1e})" if previous is not None else ""
    name = row["module"]
    if row.get("input_error") is not None and not row["input_error"] <= row["limit"]:
        owner = _enclosing(name.split("#")[0], called)
        if owner is not None:
            return f"{owner} (first seen at its {name[len(owner) + 1:]}): rel err {row['error']:.1e} > " \
                   f"{row['limit']:.1e}{before}"
    return f"{name}: rel err {row['error']:.1e} > {row['limit']:.1e}{before}"


def _enclosing(name: str, called: set[str]) -> str | None:
    """The nearest module around `name` that was itself called (a ModuleList in between is not)."""
    parts = name.split(".")
    for end in range(len(parts) - 1, 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in called:
            return candidate
    return None
