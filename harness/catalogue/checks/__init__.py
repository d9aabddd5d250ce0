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

import importlib
import textwrap

from harness.catalogue.attention import attention_classes
from harness.catalogue.checks.cp import check_cp_plan, cp_hooks, processor_problem, split_regions
from harness.catalogue.checks.tp import check_tp_plan
from harness.catalogue.checks.trees import (
    DEGREES,
    SEVERITIES,
    Finding,
    Tree,
    build_tree,
    merge,
    resolve_cp_key,
    resolve_tp_key,
    tree_of,
)

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


__all__ = ["DEGREES", "SEVERITIES", "Finding", "Tree", "attention_classes", "build_tree", "check_all", "check_cp_plan",
           "check_tp_plan", "check_trees", "class_plans", "cp_hooks", "format_table", "merge", "plan_classes",
           "processor_problem", "resolve_cp_key", "resolve_tp_key", "split_regions", "summary", "tree_of"]
