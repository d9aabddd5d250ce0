"""`_tp_plan` checks: shards that divide at every degree, column/row pairs, attention's heads, the per-head norms."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

import torch

from harness.catalogue.attention import attention_classes
from harness.catalogue.checks.cp import _call_source
from harness.catalogue.checks.trees import (
    _ADDED_QKV,
    _NORMS,
    _QKV,
    DEGREES,
    Finding,
    Rows,
    Tree,
    _join,
    _unresolved,
    resolve_tp_key,
)

# --- _tp_plan --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shard:
    """One planned Linear: its block (as `_resolve_tp_plan` groups it), side, and the sizes of the blocks sharded
    along its sharded dimension (one block for plain colwise/rowwise, one per fused projection when packed)."""

    key: str
    block: str
    path: str
    side: str  # "colwise" | "rowwise"
    sizes: tuple[int, ...]


def _tp_shard(rows: Rows, key: str, style, block: str, path: str) -> Shard | None:
    """Check one planned module's style and shape; the Shard to pair and divide, or None."""
    from diffusers.hooks.tensor_parallel import PackedColwiseParallel, PackedRowwiseParallel

    module = rows.tree.modules.get(path)
    weight = getattr(module, "weight", None)
    if not isinstance(module, (torch.nn.Linear, torch.nn.Embedding)) or weight is None or weight.dim() != 2:
        rows.add(key, "error", f"'{path}' is a {type(module).__name__}, not a Linear: ColwiseParallel / "
                               "RowwiseParallel shard Linear (and Embedding) weights")
        return None
    packed = (PackedColwiseParallel, PackedRowwiseParallel)
    if style not in ("colwise", "rowwise") and not isinstance(style, packed):
        rows.add(key, "error", f"unsupported style {style!r}: diffusers raises")
        return None
    side = "colwise" if style == "colwise" or isinstance(style, PackedColwiseParallel) else "rowwise"
    total = weight.shape[0] if side == "colwise" else weight.shape[1]
    if not isinstance(style, packed):
        return Shard(key, block, path, side, (total,))
    attribute = "_tp_packed_col_blocks" if side == "colwise" else "_tp_packed_row_blocks"
    blocks = style.blocks if style.blocks is not None else getattr(module, attribute, None)
    if not blocks:
        rows.add(key, "error", f"{type(style).__name__} without blocks and no `{attribute}` on the Linear: "
                               "diffusers raises")
        return None
    if total % sum(blocks):
        rows.add(key, "error", f"packed blocks {list(blocks)} do not divide the {total} features: diffusers raises")
        return None
    return Shard(key, block, path, side, tuple(size * (total // sum(blocks)) for size in blocks))


def _check_divisible(rows: Rows, shards: list[Shard], degrees: tuple[int, ...]) -> None:
    """Each sharded block divides by the degree (diffusers' resolve_tp_shard_specs refuses it otherwise)."""
    failing: dict[tuple[str, str, tuple[int, ...]], set[int]] = defaultdict(set)
    for shard in shards:
        for degree in degrees:
            if any(size % degree for size in shard.sizes):
                failing[(shard.key, shard.side, shard.sizes)].add(degree)
    for (key, side, sizes), bad in failing.items():
        features = "out_features" if side == "colwise" else "in_features"
        fine = [str(degree) for degree in degrees if degree not in bad]
        rows.add(key, "error", f"degree {', '.join(map(str, sorted(bad)))} fails: {features} blocks {list(sizes)} "
                               "do not divide (resolve_tp_shard_specs refuses)"
                               + (f"; degree {', '.join(fine)} is fine" if fine else ""))


def _common_prefix(left: str, right: str) -> int:
    count = 0
    for a, b in zip(left.split("."), right.split("."), strict=False):
        if a != b:
            break
        count += 1
    return count


def _check_pairs(rows: Rows, shards: list[Shard]) -> None:
    """In each block every column-wise layer feeds a row-wise one: each input block of a row-wise layer is taken
    from the nearest column-wise layers (longest common path) whose output has that size; a column-wise layer that
    no row-wise layer takes (q/k count with their v) leaves a sharded output to a layer that expects all features."""
    by_block = defaultdict(list)
    for shard in shards:
        by_block[shard.block].append(shard)
    for block_shards in by_block.values():
        columns = [shard for shard in block_shards if shard.side == "colwise"]
        rowwise = [shard for shard in block_shards if shard.side == "rowwise"]
        for shard in rowwise if not columns else []:
            rows.at_module(shard.path, "error", "row-wise with nothing column-wise in its block: "
                                                "it reads a full input as if it were its shard")
        paired = set().union(*(_producers(rows, shard, columns) for shard in rowwise))
        for shard in columns:
            if shard.path not in paired and _partner_v(shard.path) not in paired:
                rows.at_module(shard.path, "error", "column-wise, but no row-wise layer of its block "
                                                    "takes its output: it stays sharded for whatever reads it next")


def _producers(rows: Rows, shard: Shard, columns: list[Shard]) -> set[str]:
    """The column-wise layers that feed each input block of a row-wise `shard`; a block nobody produces is a row."""
    taken, unmatched = set(), []
    for size in shard.sizes:
        producers = [column for column in columns if size in column.sizes]
        if not producers:
            unmatched.append(size)
            continue
        best = max(_common_prefix(shard.path, column.path) for column in producers)
        taken |= {column.path for column in producers if _common_prefix(shard.path, column.path) == best}
    if unmatched:
        sizes = sorted({size for column in columns for size in column.sizes})
        rows.at_module(shard.path, "warning", f"row-wise input blocks {list(shard.sizes)}: {unmatched} match no "
                                              f"column-wise output of its block (sizes {sizes})")
    return taken


def _partner_v(path: str) -> str:
    """q and k feed the attention scores, not a row-wise layer: they pair when their attention's v does."""
    parent, _, name = path.rpartition(".")
    partner = {"to_q": "to_v", "to_k": "to_v", "add_q_proj": "add_v_proj", "add_k_proj": "add_v_proj"}.get(name)
    return _join(parent, partner) if partner else ""


def _norm_size(norm) -> int | None:
    weight = getattr(norm, "weight", None)
    if weight is not None:
        return int(weight.shape[-1])
    shape = getattr(norm, "normalized_shape", None) or getattr(norm, "dim", None)
    return int(tuple(shape)[-1]) if shape else None


_HEADS_RESHAPE = re.compile(r"(unflatten\(\s*-?\d+\s*,\s*\(\s*attn\.heads|view\([^)]*attn\.heads)")


def _check_attention_shards(rows: Rows, shards: list[Shard], degrees: tuple[int, ...]) -> None:
    """Attention whose projections are column-sharded: whole heads per rank, q/k/v sharded alike, per-head norms,
    a processor that reshapes by head_dim rather than by the full head count."""
    sharded = {shard.path: shard for shard in shards if shard.side == "colwise"}
    for path, module in rows.tree.modules.items():
        if not isinstance(module, attention_classes()):
            continue
        children = {name: f"{path}.{name}" if path else name for name in (*_QKV, *_ADDED_QKV, "to_qkv_mlp_proj")}
        mine = [name for name, child in children.items() if child in sharded]
        if not mine:
            continue
        heads = getattr(module, "heads", None)
        bad = [str(degree) for degree in degrees if isinstance(heads, int) and heads % degree]
        if bad:
            rows.at_module(path, "error", f"{heads} heads do not divide by degree {', '.join(bad)}: a rank would "
                                          "hold part of a head")
        for group in (_QKV, _ADDED_QKV):
            present = [name for name in group if hasattr(module, name)]
            if any(name in mine for name in present) and not all(name in mine for name in present):
                missing = [name for name in present if name not in mine]
                sharded_names = ", ".join(name for name in present if name in mine)
                rows.at_module(path, "error", f"not column-sharded: {', '.join(missing)}; column-sharded: "
                                              f"{sharded_names}: their head counts per rank disagree")
        _check_head_norms(rows, path, module, sharded, children)
        source = _call_source(type(getattr(module, "processor", None))) or ""
        if _HEADS_RESHAPE.search(source):
            rows.at_module(path, "error", f"processor {type(module.processor).__name__} reshapes by attn.heads (the "
                                          "full count) while each rank holds heads / degree")


def _check_head_norms(rows: Rows, path: str, module, sharded: dict, children: dict) -> None:
    width = next((rows.tree.modules[children[name]].out_features for name in _QKV if children[name] in sharded), None)
    heads = getattr(module, "heads", 1)
    for name in _NORMS:
        norm = getattr(module, name, None)
        size = _norm_size(norm) if isinstance(norm, torch.nn.Module) else None
        if width and size == width and isinstance(heads, int) and heads > 1:
            rows.at_module(path, "error", f"{name} normalises across all heads ({size} features) while q/k are "
                                          "column-sharded: each rank would normalise over its own heads only")


def check_tp_plan(tree: Tree, plan_name: str, plan, others: list[Tree] = (),
                  degrees: tuple[int, ...] = DEGREES) -> list[Finding]:
    """Every finding for one tensor-parallel plan on one module tree."""
    rows = Rows(tree, plan_name)
    if not isinstance(plan, dict):
        rows.add("(whole plan)", "error", f"a plan is a dict of module keys, got {type(plan).__name__}")
        return rows.done()
    shards, failures = [], {}
    for key, style in plan.items():
        try:
            pairs = resolve_tp_key(tree, key)
        except ValueError as error:
            failures[key] = str(error)
            continue
        if not pairs:
            rows.add(key, "warning", "the wildcard expands over an empty ModuleList: nothing is sharded")
        shards += [shard for block, path in pairs if (shard := _tp_shard(rows, key, style, block, path))]
    _unresolved(rows, failures, len(plan), list(others), resolve_tp_key)
    _check_divisible(rows, shards, degrees)
    _check_pairs(rows, shards)
    _check_attention_shards(rows, shards, degrees)
    return rows.done()


