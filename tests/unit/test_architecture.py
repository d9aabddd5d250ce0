"""The shape of the code, checked: no upward imports between the layers, no import circles, the rank side and the
orchestrator apart, only the orchestrator launching processes, no code outside `harness/kinds/` branching on a kind's
name, and the views (harness/report: its Python, its page scripts and stylesheet) naming no kind and no figure."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "harness"

# Lowest first: a module may import its own layer and the layers below it. The rank side (what runs inside a torchrun
# rank) and the orchestrator share layer 4 and must not import each other.
LAYERS = [
    ("harness", "harness.core", "harness.loads"),  # loads: the load axis's registry, its code importing torch lazily
    ("harness.report",),  # the views: results.json in, pages and text out (imports harness.core only)
    ("harness.catalogue",),
    ("harness.rank",),
    ("harness.faults", "harness.flows"),  # deliberate bugs (negative controls) and the calls users make around
    # enable_parallelism: both act on diffusers models inside a rank
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
            if _layer(name) == _layer(target) == _layer("harness.run") and sides and other and sides != other:
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


_LOAD_BRANCH = r"""[!=]=\s*["']({names})["']|["']({names})["']\s*[!=]=|["']({names})["']\s+(not\s+)?in\b"""


def _load_branches(text: str) -> list[str]:
    """Lines that compare something to a load's name (`load.name == "tp_lora"`, `"enable" != name`)."""
    from harness.loads import LOADS

    pattern = re.compile(_LOAD_BRANCH.format(names="|".join(map(re.escape, LOADS))))
    return [line.strip() for line in text.splitlines() if pattern.search(line)]


def test_no_code_outside_the_loads_branches_on_a_load_name():
    """Adding a load is one declaration on its code under harness/loads/ (or a module of your own); no
    `load.name == "tp_lora"` elsewhere: the rest asks the load (`checkpoint`, `prepare`, `guard`, ...)."""
    found = [f"{path.relative_to(PACKAGE.parent)}: {line}" for path in PACKAGE.rglob("*.py")
             if "loads" not in path.relative_to(PACKAGE).parts for line in _load_branches(path.read_text())]
    assert found == []


def _flow_spellings(text: str) -> list[str]:
    """Flow names spelt in code: compared with (`case.flow == "lora"`, `"cache_fbc" in chosen`), or any `_after` value
    listed (`LEFT_OUT = ("processor_after",)`); a case's own axis value (`flow="lora_scaled"`) names a case, as an id
    does."""
    from harness import flows

    names, tree = set(flows.VALUES) - {flows.NONE}, ast.parse(text)
    allowed = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.keyword) and node.arg == "flow"}
    compared = {id(constant) for node in ast.walk(tree) if isinstance(node, ast.Compare)
                for part in (node.left, *node.comparators) for constant in ast.walk(part)}
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in names
            and id(node) not in allowed and (id(node) in compared or node.value.endswith(flows.registry.SUFFIX))]


def test_no_code_outside_the_flows_spells_a_flow_name():
    """A flow is one declaration on its code under harness/flows/ (or a module of your own): what it is and where the
    quick plan runs it is declared there (`quick=`), never listed or branched on by name elsewhere."""
    found = [f"{path.relative_to(PACKAGE.parent)}: {name}" for path in PACKAGE.rglob("*.py")
             if "flows" not in path.relative_to(PACKAGE).parts for name in _flow_spellings(path.read_text())]
    assert found == []


def test_the_flow_spelling_check_sees_a_list_and_a_branch():
    """The control: the quick plan's list of left-out flows run/settings.py had, and a branch on a flow's name."""
    assert _flow_spellings('QUICK_LEFT_OUT = ("processor_after", "cache_fbc", "cache_fbc_after")\n'
                           'if case.flow == "lora":\n    pass\nControl(flow="lora_scaled_after")\n') == \
        ["processor_after", "cache_fbc_after", "lora"]


def test_the_load_branch_check_sees_a_branch():
    """The control: the if-chains rank/loading.py had before the registry are caught."""
    assert _load_branches('    if load.name == "tp_device_map":\n    elif load == "tp_cpu_offload":\n'
                          '    if not (parallel and load["name"] != "enable"):\n    x = "tp_lora"') == \
        ['if load.name == "tp_device_map":', 'elif load == "tp_cpu_offload":',
         'if not (parallel and load["name"] != "enable"):']


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(start: str) -> None:
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> the modules it imports, lazy imports inside functions included."""
    modules = _modules()
    return {name: {_existing(t, modules) for t in imports} - {None, name} for name, imports in modules.items()}


def test_no_import_circles():
    assert _circles(_graph()) == []


def test_the_circle_check_finds_a_circle():
    """The control: two modules importing each other (compare.py and compare_page.py did) form a circle."""
    graph = {**_graph(), "harness.report.compare": {"harness.report.compare_page"},
             "harness.report.compare_page": {"harness.report.compare"}}
    assert ["harness.report.compare", "harness.report.compare_page"] in _circles(graph)


def test_the_views_import_only_the_core():
    """harness/report renders results.json: it needs the records and figures (harness.core), never a kind, the
    rank side or the orchestrator."""
    graph = _graph()
    reaching = {f"{name} -> {target}" for name, targets in graph.items() if name.startswith("harness.report")
                for target in targets if not target.startswith(("harness.core", "harness.report"))}
    assert reaching == set()


def _view_files() -> list[Path]:
    report = PACKAGE / "report"
    return sorted([*report.rglob("*.py"), *report.rglob("*.js"), *report.rglob("*.css")])


def _names() -> tuple[set[str], set[str]]:
    from harness.kinds import KINDS

    figures = {spec.name for kind in KINDS.values() for spec in kind.figures}
    return set(KINDS), figures


def _naming(text: str, kinds: set[str], figures: set[str]) -> list[str]:
    """A kind's name as a string (`"train"`, `'image'`) or a figure's name as a word (`max_abs_err`, `ssim`)."""
    kind_names, figure_names = "|".join(map(re.escape, sorted(kinds))), "|".join(map(re.escape, sorted(figures)))
    kind = re.compile(rf"""["']({kind_names})["']""")
    figure = re.compile(rf"(?<![\w-])({figure_names})(?![\w-])")
    return [match.group(0) for line in text.splitlines() for match in (*kind.finditer(line), *figure.finditer(line))]


def test_no_view_names_a_kind_or_a_figure():
    """CSV, Markdown, terminal, index.html and compare.html render what a case holds: the report package's Python,
    JavaScript and CSS name no kind (a new kind needs no view change) and no figure of any kind (a new figure
    neither)."""
    kinds, figures = _names()
    assert kinds and figures
    found = [f"{path.relative_to(PACKAGE.parent)}: {name}" for path in _view_files()
             for name in _naming(path.read_text(), kinds, figures)]
    assert found == []


def test_the_naming_check_sees_a_name():
    """The control: the old page script's branch and metric reads are caught, in JS as in Python."""
    kinds, figures = _names()
    assert _naming('if (c.kind === "train") { rows.push(c.grad_err); }', kinds, figures) == ['"train"', "grad_err"]
    assert _naming("key = case.get('ssim') or case['max_abs_err']", kinds, figures) == ["ssim", "max_abs_err"]
    assert _naming(".img-ssim_map { } /* the image kinds */", kinds, figures) == []
