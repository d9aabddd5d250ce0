"""Static checks of diffusers' parallel plans against each model's module tree: `harness models --check`.

A `_cp_plan` or `_tp_plan` is only exercised when `enable_parallelism` runs under torchrun, where a key naming a
missing module, a split without its gather or a shard that does not divide shows up as a crash or a wrong picture
for one model at one degree. Here every plan is read against module trees built on the meta device (no weights):
the harness's tiny config of each spec and the class's default config (its `__init__` defaults), in about a second.

Keys resolve the way diffusers resolves them (`hooks/context_parallel.py: _find_submodule_by_name`,
`hooks/tensor_parallel.py: _resolve_tp_plan`). "The split region" is a static approximation: modules are placed in
registration pre-order, a region opens where an input named `*hidden_states` is split (RoPE outputs, timesteps,
masks and indices are split too but do not carry the sequence; a plan that splits no such input opens at its first
split) and closes at the next gather. Input tensor ranks (`expected_dims`) are runtime facts and are not checked.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import textwrap
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import torch

from harness.rank.comms_check import attention_classes

DEGREES = (2, 4)
SEVERITIES = ("error", "warning", "info")
_QKV = ("to_q", "to_k", "to_v")
_ADDED_QKV = ("add_q_proj", "add_k_proj", "add_v_proj")
_NORMS = ("norm_q", "norm_k", "norm_added_q", "norm_added_k")


@dataclass(frozen=True)
class Finding:
    """One row of `harness models --check`. `configs` names the module trees it was found on (zoo spec names,
    "default" for the class's default config)."""

    class_name: str
    plan: str
    key: str
    severity: str
    reason: str
    configs: tuple[str, ...] = ()


@dataclass
class Tree:
    """A model built on meta, with each module's span in registration pre-order (own index, last descendant)."""

    class_name: str
    label: str
    model: torch.nn.Module
    modules: dict[str, torch.nn.Module] = field(default_factory=dict)
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)

    def enter(self, name: str) -> float:
        return self.spans[name][0]

    def exit(self, name: str) -> float:
        return self.spans[name][1] + 0.5

    def homogeneous(self, path: str) -> bool:
        """Whether `path` is a ModuleList of like blocks (transformer blocks), not a mixed one (FeedForward.net)."""
        module = self.modules.get(path)
        return isinstance(module, torch.nn.ModuleList) and len({type(child) for child in module}) <= 1


def _walk(tree: Tree, module: torch.nn.Module, name: str) -> None:
    start = len(tree.spans)
    tree.spans[name] = (start, start)
    tree.modules[name] = module
    for child_name, child in module.named_children():
        _walk(tree, child, f"{name}.{child_name}" if name else child_name)
    tree.spans[name] = (start, len(tree.spans) - 1)


def tree_of(model: torch.nn.Module, label: str) -> Tree:
    tree = Tree(type(model).__name__, label, model)
    _walk(tree, model, "")
    return tree


def build_tree(cls: type, config: dict, label: str) -> Tree:
    """`cls(**config)` on the meta device: the module tree and every shape, no memory for weights."""
    with torch.device("meta"):
        return tree_of(cls(**config), label)


# --- resolving keys as diffusers does --------------------------------------------------------------------------------


def _join(path: str, atom: str) -> str:
    return f"{path}.{atom}" if path else atom


def _find_cp(module, path: str, name: str) -> list[tuple[str, object]]:
    """Mirror of diffusers' `_find_submodule_by_name`, keeping each match's path."""
    if name == "":
        return [(path, module)]
    first, rest = name.split(".", 1) if "." in name else (name, "")
    if first == "*":
        if not isinstance(module, torch.nn.ModuleList):
            raise ValueError("Wildcard '*' can only be used with ModuleList")
        return [hit for index, sub in enumerate(module) for hit in _find_cp(sub, _join(path, str(index)), rest)]
    if not hasattr(module, first):
        raise ValueError(f"'{first}' is not a submodule of '{module.__class__.__name__}'")
    return _find_cp(getattr(module, first), _join(path, first), rest)


def resolve_cp_key(tree: Tree, key: str) -> list[str]:
    """Module paths a `_cp_plan` key hooks; ValueError with diffusers' own message when it resolves nowhere."""
    if key.count("*") > 1:
        raise ValueError("Wildcard '*' can only be used once in the name")
    hits = _find_cp(tree.model, "", key)
    for path, found in hits:
        if not isinstance(found, torch.nn.Module):
            raise ValueError(f"'{path}' is a {type(found).__name__}, not a module: no hook can be registered on it")
    return [path for path, _ in hits]


def _getattr_path(obj, path: str, dotted: str):
    for atom in dotted.split(".") if dotted else []:
        if not hasattr(obj, atom):
            raise ValueError(f"'{obj.__class__.__name__}' object has no attribute '{atom}'")
        obj, path = getattr(obj, atom), _join(path, atom)
    return obj, path


def resolve_tp_key(tree: Tree, key: str) -> list[tuple[str, str]]:
    """(block path, module path) pairs a `_tp_plan` key shards, grouped per block as `_resolve_tp_plan` groups them."""
    if key.count("*") > 1:
        raise ValueError(f"Wildcard '*' can only be used once in a `_tp_plan` key, got '{key}'.")
    if "*" not in key:
        _, path = _getattr_path(tree.model, "", key)
        return [("", path)]
    prefix, _, suffix = key.partition("*")
    container, base = _getattr_path(tree.model, "", prefix.strip("."))
    if not isinstance(container, torch.nn.ModuleList):
        raise ValueError(f"wildcard '{key}' must expand over a ModuleList, but '{base}' is a "
                         f"{container.__class__.__name__}")
    pairs = []
    for index, block in enumerate(container):
        _, path = _getattr_path(block, _join(base, str(index)), suffix.strip("."))
        pairs.append((_join(base, str(index)), path))
    return pairs


def _resolves(tree: Tree, key: str, resolver) -> bool:
    try:
        return bool(resolver(tree, key))
    except ValueError:
        return False


# --- rows: grouping module paths and indexed keys --------------------------------------------------------------------


def _pattern(path: str, starred=lambda prefix: True) -> tuple[str, tuple[int, ...]]:
    """'blocks.3.attn1' -> ('blocks.*.attn1', (3,)): the index atoms `starred` accepts (by the list's path) become
    '*'."""
    atoms, shown, indices = path.split("."), [], []
    for position, atom in enumerate(atoms):
        if atom.isdigit() and starred(".".join(atoms[:position])):
            shown.append("*")
            indices.append(int(atom))
        else:
            shown.append(atom)
    return ".".join(shown), tuple(indices)


def _ranges(numbers: Iterable[int]) -> str:
    numbers, parts, start = sorted(set(numbers)), [], None
    for position, number in enumerate(numbers):
        start = number if start is None else start
        if position + 1 == len(numbers) or numbers[position + 1] != number + 1:
            parts.append(str(start) if start == number else f"{start}..{number}")
            start = None
    return ",".join(parts)


def collapse(paths: Iterable[str], tree: Tree | None = None) -> list[str]:
    """Paths that differ in one block index only, as one key: '*' when they are every match in `tree`, else the
    indices ('blocks.{2..39}.attn1'), so forty identical rows read as one. With a tree, only indices into lists of
    like blocks are starred (`ff.net.0.proj` stays as it is)."""
    starred = tree.homogeneous if tree is not None else (lambda prefix: True)
    groups: dict[str, set[str]] = defaultdict(set)
    for path in paths:
        groups[_pattern(path, starred)[0]].add(path)
    total = Counter(_pattern(path, starred)[0] for path in (tree.modules if tree is not None else ()))
    keys = []
    for pattern, members in groups.items():
        if total[pattern] == len(members):
            keys.append(pattern)
        elif len(members) > 1 and pattern.count("*") == 1:
            numbers = (_pattern(path, starred)[1][0] for path in members)
            keys.append(pattern.replace("*", "{" + _ranges(numbers) + "}"))
        else:
            keys += members
    return sorted(keys)


class Rows:
    """Collects findings for one (tree, plan); module-level findings are merged per reason and collapsed."""

    def __init__(self, tree: Tree, plan: str):
        self.tree, self.plan, self.rows = tree, plan, []
        self._grouped: dict[tuple[str, str], list[str]] = defaultdict(list)

    def add(self, key: str, severity: str, reason: str) -> None:
        key = key if key != "" else "(root)"
        self.rows.append(Finding(self.tree.class_name, self.plan, key, severity, reason, (self.tree.label,)))

    def at_module(self, path: str, severity: str, reason: str) -> None:
        self._grouped[(severity, reason)].append(path)

    def done(self) -> list[Finding]:
        for (severity, reason), paths in self._grouped.items():
            for key in collapse(paths, self.tree):
                self.add(key, severity, reason)
        return merge(self.rows)


# --- both plans: keys that resolve nowhere ---------------------------------------------------------------------------


def _where_else(tree: Tree, key: str, others: list[Tree], resolver) -> str:
    """Why a key may be missing here: it fits another config of this class, or it is another class's key."""
    same = [other.label for other in others if other.class_name == tree.class_name and other is not tree
            and _resolves(other, key, resolver)]
    if same:
        return f"; it resolves on the {', '.join(same)} config: the plan depends on the config"
    foreign = sorted({other.class_name for other in others if other.class_name != tree.class_name
                      and _resolves(other, key, resolver)})
    if foreign:
        return f"; it resolves in {', '.join(foreign)}: a plan copied from another model?"
    return ""


def _unresolved(rows: Rows, failures: dict[str, str], plan_size: int, others: list[Tree], resolver) -> None:
    """One error row per group of unresolved keys that differ in one index, and one for a plan that is mostly
    foreign (copied from another model)."""
    by_pattern: dict[str, list[str]] = defaultdict(list)
    for key in failures:
        by_pattern[_pattern(key)[0]].append(key)
    for keys in by_pattern.values():
        count = f" ({len(keys)} keys)" if len(keys) > 1 else ""
        hint = _where_else(rows.tree, keys[0], others, resolver)
        for shown in collapse(keys):
            rows.add(shown, "error", f"resolves nowhere{count}: {failures[keys[0]]}{hint}")
    foreign = [key for key in failures if not any(other.class_name == rows.tree.class_name and other is not rows.tree
                                                   and _resolves(other, key, resolver) for other in others)]
    if foreign and 2 * len(foreign) >= plan_size:
        owners = [name for name in sorted({other.class_name for other in others})
                  if name != rows.tree.class_name and all(_resolves(other, key, resolver) for key in foreign
                                                          for other in others if other.class_name == name)]
        source = f"; all of them resolve in {', '.join(owners)}" if owners else ""
        rows.add("(whole plan)", "error", f"{len(foreign)} of {plan_size} keys resolve nowhere in this class: a "
                                          f"plan written for another model{source}")


# --- _cp_plan --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hook:
    """Where a split or gather happens: at a module's entry (input split) or exit (split_output, gather)."""

    key: str
    path: str
    kind: str  # "split" | "split_output" | "gather"
    at: float
    names: tuple = ()


def _forward_parameters(module_class: type) -> tuple[set[str], bool]:
    parameters = list(inspect.signature(module_class.forward).parameters.values())[1:]
    names = {parameter.name for parameter in parameters}
    return names, any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters)


def _dim_problem(dim: int, expected: int | None, what: str) -> str | None:
    if expected is not None and not -expected <= dim < expected:
        return f"{what} {dim} is out of range for expected_dims={expected}"
    return None


def _check_input(rows: Rows, key: str, name, spec, classes: set[type]) -> None:
    """One entry of a split dict: its type, its name against forward's signature, its split_dim."""
    from diffusers.models._modeling_parallel import ContextParallelInput

    specs = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    if not specs or not all(isinstance(item, ContextParallelInput) for item in specs):
        rows.add(key, "error", f"{name!r}: expected ContextParallelInput (or a list of them), got {spec!r}")
        return
    for item in specs:
        problem = _dim_problem(item.split_dim, item.expected_dims, "split_dim")
        if problem:
            rows.add(key, "error", f"{name!r}: {problem}")
    output = specs[0].split_output
    if isinstance(name, int) and not output:
        rows.add(key, "error", f"integer key {name} without split_output=True: pre_forward looks it up as a "
                               "parameter name and raises")
    elif isinstance(name, str) and output:
        rows.add(key, "error", f"{name!r} has split_output=True: post_forward indexes the output with a string")
    elif isinstance(name, str):
        for module_class in sorted(classes, key=lambda item: item.__name__):
            parameters, var_keyword = _forward_parameters(module_class)
            if name not in parameters:
                severity = "warning" if var_keyword else "error"
                tail = "only works when passed by keyword (**kwargs)" if var_keyword else "pre_forward raises"
                rows.add(key, severity, f"{name!r} is not a parameter of {module_class.__name__}.forward: {tail}")


def _cp_hooks(rows: Rows, key: str, value, paths: list[str]) -> list[Hook]:
    """Check one plan entry's value and place its hooks."""
    from diffusers.models._modeling_parallel import ContextParallelOutput

    tree = rows.tree
    if isinstance(value, dict):
        classes = {type(tree.modules[path]) for path in paths}
        for name, spec in value.items():
            _check_input(rows, key, name, spec, classes)
        if not value:
            rows.add(key, "warning", "empty split dict: the hook does nothing")
        names = tuple(name for name, spec in value.items() if isinstance(name, str))
        hooks = [Hook(key, path, "split", tree.enter(path), names) for path in paths if names]
        if any(isinstance(name, int) for name in value):
            hooks += [Hook(key, path, "split_output", tree.exit(path)) for path in paths]
        return hooks
    items = [value] if isinstance(value, ContextParallelOutput) else value
    if not isinstance(items, (list, tuple)) or not items or not all(
            isinstance(item, ContextParallelOutput) for item in items):
        rows.add(key, "error", f"expected a dict of ContextParallelInput or ContextParallelOutput(s), got {value!r}: "
                               "apply_context_parallel raises")
        return []
    for item in items:
        problem = _dim_problem(item.gather_dim, item.expected_dims, "gather_dim")
        if problem:
            rows.add(key, "error", problem)
    return [Hook(key, path, "gather", tree.exit(path)) for path in paths]


def _check_pairing(rows: Rows, hooks: list[Hook]) -> set[str]:
    """Every split has a gather after it and every gather a split before it (registration order); the paths
    reported, so the blockwise check does not report them twice."""
    splits = [hook for hook in hooks if hook.kind != "gather"]
    gathers = [hook for hook in hooks if hook.kind == "gather"]
    if splits and not gathers:
        rows.add("(whole plan)", "error", "splits but never gathers (no ContextParallelOutput): the model's output "
                                          "stays sharded, each rank returns its own chunk")
        return set()
    if gathers and not splits:
        rows.add("(whole plan)", "error", "gathers but never splits: every rank's full output is concatenated "
                                          "world-size times")
        return set()
    reported = set()
    for hook in splits:
        if not any(gather.at > hook.at for gather in gathers):
            reported.add(hook.path)
            rows.at_module(hook.path, "error", f"split by '{hook.key}' with no gather after it (registration "
                                               "order): what it splits is never gathered back")
    for hook in gathers:
        if not any(split.at < hook.at for split in splits):
            reported.add(hook.path)
            rows.at_module(hook.path, "error", f"gathered by '{hook.key}' with nothing split before it "
                                               "(registration order): a full tensor is concatenated world-size times")
    return reported


def _list_slot(path: str) -> tuple[str, int, str] | None:
    """'blocks.5.attn1' -> ('blocks', 5, 'attn1'): the last index atom of a path."""
    atoms = path.split(".")
    spots = [position for position, atom in enumerate(atoms) if atom.isdigit()]
    if not spots:
        return None
    spot = spots[-1]
    return ".".join(atoms[:spot]), int(atoms[spot]), ".".join(atoms[spot + 1:])


def _check_blockwise(rows: Rows, hooks: list[Hook], reported: set[str]) -> None:
    """Where some blocks of a ModuleList split and gather at the same submodule, every block that splits there
    must gather there too (and back): otherwise the next block gets a sharded sequence and splits it again."""
    split, gather = defaultdict(set), defaultdict(set)
    for hook in hooks:
        slot = _list_slot(hook.path)
        if slot is not None and hook.kind in ("split", "gather"):
            (split if hook.kind == "split" else gather)[(slot[0], slot[2])].add(slot[1])
    for (prefix, suffix), split_at in split.items():
        gathered_at = gather.get((prefix, suffix), set())
        if not gathered_at:
            continue
        lonely = [(index, "split here but not gathered here, while other blocks gather at the same place: the "
                          "next split shards a sharded sequence") for index in split_at - gathered_at]
        lonely += [(index, "gathered here but not split here, while other blocks split at the same place: a full "
                           "tensor is concatenated world-size times") for index in gathered_at - split_at]
        for index, reason in lonely:
            path = f"{prefix}.{index}.{suffix}".rstrip(".")
            if path not in reported:
                rows.at_module(path, "error", reason)


def _check_explicit_indices(rows: Rows, plan: dict) -> None:
    """Explicit block indices next to a wildcard over the same blocks fit one block count only (Helios: 40)."""
    explicit: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    for key in plan:
        slot = _list_slot(key)
        if slot is not None and f"{slot[0]}.*.{slot[2]}".rstrip(".") in plan:
            explicit[slot[0]][slot[2]].add(slot[1])
    for prefix, by_suffix in explicit.items():
        indices = set().union(*by_suffix.values())
        if len(indices) < 2:
            continue
        suffixes = "/".join(sorted(by_suffix))
        rows.add(f"{prefix}.{{{_ranges(indices)}}}.{suffixes}", "warning",
                 f"names {len(indices)} blocks one by one next to the wildcard '{prefix}.*': the plan fits exactly "
                 f"{max(indices) + 1} blocks; with fewer enable_parallelism raises, with more the extra blocks are "
                 "split by the wildcard and never gathered")


def _whole_streams(tree: Tree, hooks: list[Hook]) -> set[str]:
    """Streams the plan never splits, named by the root forward's inputs: `audio_hidden_states` -> 'audio'."""
    split = {name for hook in hooks for name in hook.names if isinstance(name, str)}
    parameters, _ = _forward_parameters(type(tree.model))
    split_words = {name.split("_")[0] for name in split}
    return {name.split("_")[0] for name in parameters
            if name.endswith("_hidden_states") and name not in split} - split_words


def _check_split_siblings(rows: Rows, hooks: list[Hook]) -> None:
    """A sibling of the same class as a module whose output is split (a RoPE), not split itself: a split stream
    that uses its embedding meets full-length positions. Siblings named after a stream the plan leaves whole
    (`audio_rope` next to an unsplit `audio_hidden_states`) are taken to embed that stream."""
    hooked = {hook.path for hook in hooks}
    whole = _whole_streams(rows.tree, hooks)
    for path in sorted({hook.path for hook in hooks if hook.kind == "split_output"}):
        parent_path, _, _ = path.rpartition(".")
        for name, sibling in rows.tree.modules[parent_path].named_children():
            sibling_path = _join(parent_path, name)
            if sibling_path in hooked or type(sibling) is not type(rows.tree.modules[path]):
                continue
            if whole & set(name.split("_")):
                continue
            rows.at_module(sibling_path, "warning", f"same class as '{path}', whose output is split, but not split "
                           "itself: a split stream that uses its embedding meets full-length positions")


@functools.cache
def _call_source(processor_class: type) -> str | None:
    try:
        return inspect.getsource(processor_class.__call__)
    except (OSError, TypeError):
        return None


def processor_problem(processor) -> str | None:
    """Why an attention processor would attend only to its own chunk under context parallelism, or None."""
    if processor is None:
        return "has no processor"
    name = type(processor).__name__
    if not hasattr(processor, "_parallel_config"):
        return f"processor {name} has no `_parallel_config`, so enable_parallelism never hands it the CP config"
    source = _call_source(type(processor))
    if source is not None and ("dispatch_attention_fn" not in source or "parallel_config" not in source):
        return f"processor {name}.__call__ never passes `_parallel_config` to dispatch_attention_fn"
    return None


def split_regions(hooks: list[Hook]) -> list[tuple[float, float]]:
    """(start, end) positions where the sequence is split: from each split of a `*hidden_states` input (any split
    when the plan splits none) to the next gather; inf when none follows."""
    gathers = sorted(hook.at for hook in hooks if hook.kind == "gather")
    openers = [hook for hook in hooks if hook.kind == "split" and any(
        isinstance(name, str) and name.endswith("hidden_states") for name in hook.names)]
    openers = openers or [hook for hook in hooks if hook.kind != "gather"]
    return [(hook.at, next((at for at in gathers if at > hook.at), float("inf"))) for hook in openers]


def _check_attention(rows: Rows, hooks: list[Hook]) -> None:
    """Attention inside a split region must take part in CP; attention outside one sees the whole sequence."""
    regions = split_regions(hooks)
    if not regions:
        return
    classes = attention_classes()
    for path, module in rows.tree.modules.items():
        if not isinstance(module, classes):
            continue
        at = rows.tree.enter(path)
        inside = any(start <= at <= end for start, end in regions)
        problem = processor_problem(getattr(module, "processor", None))
        if inside and problem:
            rows.at_module(path, "error", f"inside the split region, but {problem}: it attends to its own chunk only")
        elif not inside:
            tail = ("its processor still gets the CP config, so ring/Ulysses run over world-size identical copies: "
                    "the same numbers, world-size times the attention work" if problem is None else
                    "no context parallelism for it")
            rows.at_module(path, "warning", f"outside the split region (registration order): it runs on the whole "
                                            f"sequence on every rank; {tail}")


def cp_hooks(tree: Tree, plan: dict) -> list[Hook]:
    """Where `plan` splits and gathers on `tree` (keys that resolve nowhere left out)."""
    rows, hooks = Rows(tree, ""), []
    for key, value in plan.items():
        try:
            hooks += _cp_hooks(rows, key, value, resolve_cp_key(tree, key))
        except ValueError:
            continue
    return hooks


def check_cp_plan(tree: Tree, plan_name: str, plan, others: list[Tree] = (), from_config: bool = False
                  ) -> list[Finding]:
    """Every finding for one context-parallel plan on one module tree; `from_config`: the plan was derived from
    this very config (a spec's cp_plan), so naming its blocks one by one is no fragility."""
    rows = Rows(tree, plan_name)
    if not isinstance(plan, dict):
        rows.add("(whole plan)", "error", f"a plan is a dict of module keys, got {type(plan).__name__}")
        return rows.done()
    hooks, failures = [], {}
    for key, value in plan.items():
        try:
            paths = resolve_cp_key(tree, key)
        except ValueError as error:
            failures[key] = str(error)
            continue
        if not paths:
            rows.add(key, "warning", "the wildcard expands over an empty ModuleList: no hook is registered")
        hooks += _cp_hooks(rows, key, value, paths)
    _unresolved(rows, failures, len(plan), list(others), resolve_cp_key)
    reported = _check_pairing(rows, hooks)
    _check_blockwise(rows, hooks, reported)
    if not from_config:
        _check_explicit_indices(rows, plan)
    _check_attention(rows, hooks)
    _check_split_siblings(rows, hooks)
    return rows.done()


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


# --- every class of the installed diffusers --------------------------------------------------------------------------


def class_plans(cls: type) -> dict[str, dict]:
    return {name: getattr(cls, name) for name in ("_cp_plan", "_tp_plan") if getattr(cls, name, None) is not None}


def _configs(class_name: str) -> list[tuple[str, dict, object]]:
    """(label, config, spec) to build: each zoo spec of the class, then the class's default config."""
    from harness.catalogue.zoo import SPECS

    specs = [(spec.name, spec.config, spec) for spec in SPECS.values() if spec.class_name == class_name]
    return [*specs, ("default", {}, None)]


def _build_all(classes: list[type]) -> tuple[list[tuple[Tree, object]], list[Finding]]:
    built, rows = [], []
    for cls in classes:
        configs = _configs(cls.__name__)
        if len(configs) == 1:
            rows += [Finding(cls.__name__, plan, "(whole plan)", "info", "no zoo spec: checked on the class's default "
                             "config only", ("default",)) for plan in class_plans(cls)]
        for label, config, spec in configs:
            try:
                built.append((build_tree(cls, config, label), spec))
            except Exception as error:  # noqa: BLE001 - one class that cannot be built must not hide the others
                rows.append(Finding(cls.__name__, "(class)", "(whole plan)", "warning",
                                    f"could not build, plans not checked: {type(error).__name__}: {error}", (label,)))
    return built, rows


def check_trees(built: list[tuple[Tree, object]], degrees: tuple[int, ...] = DEGREES) -> list[Finding]:
    """Each class plan on each tree, and each spec's own cp_plan override on its spec's tree."""
    trees = [tree for tree, _ in built]
    rows = []
    for tree, spec in built:
        cls = type(tree.model)
        for name, plan in class_plans(cls).items():
            if name == "_cp_plan":
                rows += check_cp_plan(tree, name, plan, trees)
            else:
                rows += check_tp_plan(tree, name, plan, trees, degrees)
        if spec is not None and spec.cp_plan is not None:
            rows += check_cp_plan(tree, "spec cp_plan", spec.context_parallel_plan(), trees, from_config=True)
    return rows


def merge(findings: Iterable[Finding]) -> list[Finding]:
    """The same finding on several configs is one row naming them all; sorted by class, severity, plan, key."""
    merged: dict[tuple, Finding] = {}
    for row in findings:
        identity = (row.class_name, row.plan, row.key, row.severity, row.reason)
        seen = merged.get(identity)
        merged[identity] = row if seen is None else replace(seen, configs=(*seen.configs, *row.configs))
    return sorted(merged.values(), key=lambda row: (row.class_name, SEVERITIES.index(row.severity), row.plan, row.key))


def plan_classes() -> list[type]:
    from harness.catalogue.zoo.discover import parallel_classes

    return [getattr(importlib.import_module(row["module"]), row["class_name"]) for row in parallel_classes()]


def check_all(classes: list[type] | None = None, degrees: tuple[int, ...] = DEGREES) -> tuple[list[Finding], int]:
    """Findings for every class with a plan (default: every such class of the installed diffusers), merged across
    configs, and the number of module trees built."""
    built, rows = _build_all(plan_classes() if classes is None else classes)
    return merge([*rows, *check_trees(built, degrees)]), len(built)


def format_table(findings: list[Finding], width: int = 120) -> str:
    """Rows grouped under their class; the reason (and the configs it holds on) wrapped to `width` columns."""
    key_width = min(44, max([len("key"), *(len(row.key) for row in findings)]))
    lead = 2 + 8 + 1 + 12 + 1 + key_width + 1
    lines, current = [f"  {'severity':8} {'plan':12} {'key':{key_width}} reason [configs]"], None
    if not findings:
        return lines[0] + "\n  no findings"
    for row in findings:
        if row.class_name != current:
            current = row.class_name
            lines.append(current)
        text = textwrap.wrap(f"{row.reason} [{', '.join(row.configs)}]", width - lead) or [""]
        start = f"  {row.severity:8} {row.plan:12} "
        if len(row.key) > key_width:
            lines.append(start + row.key)
            start = " " * len(start) + " " * (key_width + 1)
        else:
            start += f"{row.key:{key_width}} "
        lines.append(start + text[0])
        lines += [" " * lead + part for part in text[1:]]
    return "\n".join(lines)


def summary(findings: list[Finding], classes: int, trees: int, degrees: tuple[int, ...] = DEGREES) -> str:
    counts = ", ".join(f"{sum(row.severity == s for row in findings)} {s}" for s in SEVERITIES)
    return (f"plan checks: {classes} classes, {trees} module trees (zoo and default configs, on meta), TP degrees "
            f"{', '.join(map(str, degrees))}: {counts}")
