"""The module trees plans are read against (built on the meta device), plan keys resolved the way diffusers
resolves them, findings and the rows that group module paths, and plan keys that resolve nowhere."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import torch

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


def merge(findings: Iterable[Finding]) -> list[Finding]:
    """The same finding on several configs is one row naming them all; sorted by class, severity, plan, key."""
    merged: dict[tuple, Finding] = {}
    for row in findings:
        identity = (row.class_name, row.plan, row.key, row.severity, row.reason)
        seen = merged.get(identity)
        merged[identity] = row if seen is None else replace(seen, configs=(*seen.configs, *row.configs))
    return sorted(merged.values(), key=lambda row: (row.class_name, SEVERITIES.index(row.severity), row.plan, row.key))
