"""The shape of the code, checked: no upward imports between the layers, the rank side and the orchestrator apart,
only the orchestrator launching processes, and no code outside `harness/kinds/` branching on a kind's name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "harness"

# Lowest first: a module may import its own layer and the layers below it. The rank side (what runs inside a torchrun
# rank) and the orchestrator share layer 4 and must not import each other.
LAYERS = [
    ("harness", "harness.core"),
    ("harness.catalogue",),
    ("harness.rank", "harness.report"),
    ("harness.kinds",),
    ("harness.engine", "harness.run", "harness.versions"),  # versions: across diffusers revisions, over `harness run`
    ("harness.cli", "harness.plugin", "harness.__main__"),
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harness"):
            # `from harness.rank import backends` imports the module harness.rank.backends (resolved below to the
            # longest existing module); `from harness.rank.plan import Case` imports from harness.rank.plan
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("harness")}
    return found


def _modules() -> dict[str, set[str]]:
    return {_module_name(path): _imports(path) for path in PACKAGE.rglob("*.py")}


def _layer(name: str) -> int:
    """The layer of the longest prefix that names `name` (a module, or a name imported from a package)."""
    best, level = -1, None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), index
    return level


def _existing(name: str, modules: dict) -> str | None:
    """`harness.run.plan.Case` -> `harness.run.plan`: the longest prefix that is a module of the package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def test_every_module_has_a_layer():
    assert [name for name in _modules() if _layer(name) is None] == []


def test_no_module_imports_a_layer_above_its_own():
    modules, upward = _modules(), []
    for name, imports in modules.items():
        for target in {_existing(t, modules) for t in imports} - {None}:
            if _layer(target) > _layer(name):
                upward.append(f"{name} -> {target}")
    assert upward == []


def test_the_rank_side_and_the_orchestrator_do_not_import_each_other():
    modules, crossing = _modules(), []
    for name, imports in modules.items():
        for target in {_existing(t, modules) for t in imports} - {None}:
            sides = {side for side in ("harness.run", "harness.engine") if f"{name}.".startswith(side + ".")}
            other = {side for side in ("harness.run", "harness.engine") if f"{target}.".startswith(side + ".")}
            if _layer(name) == _layer(target) == 4 and sides and other and sides != other:
                crossing.append(f"{name} -> {target}")
    assert crossing == []


def test_only_the_orchestrator_launches_processes():
    modules = _modules()
    launching = sorted(name for name, imports in modules.items()
                       if "harness.run.launch" in {_existing(t, modules) for t in imports})
    assert launching == ["harness.run.runner"]


def test_no_code_outside_the_kind_modules_branches_on_a_kind_name():
    """Adding a kind is one module under harness/kinds/ plus its registration; no `kind == "image"` elsewhere."""
    from harness.kinds import KINDS

    names = "|".join(KINDS)
    pattern = re.compile(rf"""\bkind\w*\s*[!=]=\s*["']({names})["']|["']({names})["']\s*[!=]=\s*\w*kind|"""
                         rf"""["']({names})["']\s+(not\s+)?in\s+\w*kinds?\b""")
    found = [f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
             for path in PACKAGE.rglob("*.py") if "kinds" not in path.relative_to(PACKAGE).parts
             for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []
