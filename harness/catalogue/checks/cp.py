"""`_cp_plan` checks: inputs split as the forward takes them, splits paired with gathers, block-wise plans, the
split region each attention runs in, and processors that can take the CP config."""

from __future__ import annotations

import functools
import inspect
from collections import defaultdict
from dataclasses import dataclass

from harness.catalogue.attention import attention_classes
from harness.catalogue.checks.trees import Finding, Rows, Tree, _join, _ranges, _unresolved, resolve_cp_key

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


