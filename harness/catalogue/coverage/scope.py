"""Which statements of the installed diffusers are its parallel code: the list of modules, declared once, and the
statements of each that `harness run --coverage` measures, read from the source itself.

The list names each module where diffusers keeps it, and finds it through an object diffusers exports where one
does, so a release that moved it is still measured; a release without it says so (`ModuleCoverage.absent`). What is
measured of a module:
- `whole`: every statement inside its functions and methods (the context-parallel and tensor-parallel hooks, the
  parallel configs);
- otherwise its parallel code paths: each statement that names the parallel configuration (a `_parallel_config`, a
  `tp_shard_specs`, a name it imports from the whole modules above), the branch of each `if` that tests it (the
  `else` of `if _parallel_config is None`), every function whose name says it is parallel (`enable_parallelism`,
  `_templated_context_parallel_attention`), and, transitively, every function and class of the module those
  statements call (the templated ring and Ulysses attention, their all-to-alls, each backend's forward and
  backward ops).
Import-time statements (imports, `def` lines, class bodies, decorators) are left out: they run whenever diffusers is
imported and say nothing of what a plan drove.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path

from harness.core.coverage import FLOWS, PARALLEL

# Names that carry the parallel configuration through diffusers' code (keyword arguments, attributes, locals).
TOKENS = frozenset({"_parallel_config", "parallel_config", "context_parallel_config", "tensor_parallel_config",
                    "cp_config", "tp_config", "cp_plan", "_cp_plan", "_tp_plan", "tp_shard_specs",
                    "weights_already_sharded"})
# A function whose name matches is parallel code as a whole (`enable_parallelism`, `_resolve_parallel_config`).
PARALLEL_NAME = re.compile(r"parallelism|parallel_config|context_parallel|tensor_parallel")


@dataclass(frozen=True)
class Part:
    """A module of diffusers' parallel code: where it lives (`module`, or the module of the object `locate` names,
    `package:attribute`), what of it is measured (`whole`, or only the `functions` named, each whole), in words
    (`title`), and its group."""

    module: str
    title: str
    whole: bool
    locate: str = ""
    group: str = PARALLEL
    functions: tuple[str, ...] = ()


PARTS = (
    Part("diffusers.hooks.context_parallel", "context-parallel hooks: every function", True),
    Part("diffusers.hooks.tensor_parallel", "tensor-parallel hooks: every function", True),
    Part("diffusers.models._modeling_parallel", "parallel configs and plans: every function", True,
         "diffusers:ContextParallelConfig"),
    Part("diffusers.models.attention_dispatch", "the context-parallel paths of every backend and the templated "
         "ring / Ulysses attention they call", False, "diffusers.models.attention_dispatch:dispatch_attention_fn"),
    Part("diffusers.models.modeling_utils", "ModelMixin's parallel paths (enable_parallelism, the parallel_config "
         "branches of from_pretrained and of loading)", False, "diffusers:ModelMixin"),
)
# What the flows (harness/flows) call around enable_parallelism, measured when a run has flows: the LoRA/PEFT
# integration, the hooks (caches, group offloading, layerwise casting), the processor and backend setters and the
# QKV fusion. A module a release lacks is absent, as above.
_HOOKS = (("hooks", "the hook registry every hook below goes through"), ("group_offloading", "group offloading"),
          ("layerwise_casting", "layerwise casting"), ("first_block_cache", "First Block Cache"),
          ("pyramid_attention_broadcast", "Pyramid Attention Broadcast"), ("faster_cache", "FasterCache"),
          ("taylorseer_cache", "TaylorSeer cache"), ("mag_cache", "MagCache"))
FLOW_PARTS = (
    Part("diffusers.loaders.peft", "LoRA/PEFT integration: load_lora_adapter, set_adapters, fuse_lora, add_adapter "
         "and the tensor-parallel guard", True, group=FLOWS),
    Part("diffusers.utils.peft_utils", "PEFT helpers: scales, adapter layers, the state-dict checks", True,
         group=FLOWS),
    *(Part(f"diffusers.hooks.{name}", f"hooks: {title}", True, group=FLOWS) for name, title in _HOOKS),
    Part("diffusers.models.attention", "processor and backend setters, QKV fusion", False, group=FLOWS,
         functions=("AttentionMixin.attn_processors", "AttentionMixin.set_attn_processor",
                    "AttentionMixin.fuse_qkv_projections", "AttentionMixin.unfuse_qkv_projections",
                    "AttentionModuleMixin.set_processor", "AttentionModuleMixin.set_attention_backend",
                    "AttentionModuleMixin.fuse_projections", "AttentionModuleMixin.unfuse_projections")),
    Part("diffusers.models.attention_dispatch", "the backend setters", False, group=FLOWS,
         locate="diffusers.models.attention_dispatch:dispatch_attention_fn",
         functions=("_AttentionBackendRegistry.set_active_backend", "attention_backend",
                    "_check_attention_backend_requirements")),
)


@dataclass
class FunctionScope:
    """The measured statements of one function (`Class.method` for a method), by their first line."""

    name: str
    first: int
    last: int
    lines: set[int] = field(default_factory=set)


@dataclass
class ModuleScope:
    part: Part
    key: str  # the file's path inside the diffusers package
    path: Path | None  # None: this diffusers has no such module
    functions: list[FunctionScope] = field(default_factory=list)
    absent: str = ""
    tree: ast.Module | None = None  # the parsed source, for the reasons of what never ran

    @property
    def lines(self) -> set[int]:
        return {line for function in self.functions for line in function.lines}


def locate(part: Part) -> Path | None:
    """The source file of `part` in the installed diffusers: through the object diffusers exports where one is
    named, else by the module's own name; None when neither exists."""
    if part.locate:
        package, _, attribute = part.locate.partition(":")
        try:
            found = getattr(importlib.import_module(package), attribute)
            return Path(inspect.getsourcefile(found)).resolve()
        except (ImportError, AttributeError, TypeError):
            pass
    try:
        spec = importlib.util.find_spec(part.module)
    except ImportError:
        spec = None
    return Path(spec.origin).resolve() if spec is not None and spec.origin else None


def package_root() -> Path:
    spec = importlib.util.find_spec("diffusers")
    return Path(spec.origin).resolve().parent


def scopes(parts=PARTS) -> list[ModuleScope]:
    """Every part of the list, resolved against the installed diffusers."""
    root = package_root()
    found = [(part, locate(part)) for part in parts]
    # the parallel modules' names called elsewhere are parallel code; the flows' modules add none to that
    whole = {_dotted(path, root) for part, path in found if path is not None and part.whole and part.group == PARALLEL}
    out = []
    for part, path in found:
        if path is None:
            key = part.module.removeprefix("diffusers.").replace(".", "/") + ".py"
            out.append(ModuleScope(part, key, None, absent=f"this diffusers has no {part.module}"))
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        tokens = TOKENS | _imported_from(tree, _dotted(path, root), whole)
        functions = measured(tree, part.whole, tokens) if not part.functions else \
            [found for found in measured(tree, True) if found.name in part.functions]
        out.append(ModuleScope(part, path.relative_to(root).as_posix(), path, functions, tree=tree))
    return out


def measured(tree: ast.Module, whole: bool, tokens=TOKENS) -> list[FunctionScope]:
    """The functions of a module and the statements of each that are measured (see the module's docstring)."""
    defs = definitions(tree)
    functions = {name: FunctionScope(name, node.lineno, node.end_lineno or node.lineno)
                 for name, node in functions_of(tree)}
    nodes = dict(functions_of(tree))
    if whole:
        for name, node in nodes.items():
            functions[name].lines = _lines(node.body)
        return [f for f in functions.values() if f.lines]
    roots: dict[str, list[ast.stmt]] = {}
    for name, node in nodes.items():
        if PARALLEL_NAME.search(name.rpartition(".")[2]):
            roots[name] = list(node.body)
        else:
            roots[name] = _parallel_statements(node.body, tokens)
    todo = [stmt for body in roots.values() for stmt in body]
    taken = {name for name, body in roots.items() if body and PARALLEL_NAME.search(name.rpartition(".")[2])}
    while todo:
        stmt = todo.pop()
        for called in names_read(stmt) & set(defs) - taken:
            taken.add(called)
            for name, node in members(called, defs[called]):
                roots[name] = list(node.body)
                todo.extend(node.body)
    for name, body in roots.items():
        functions[name].lines = _lines(body)
    return [f for f in functions.values() if f.lines]


def functions_of(tree: ast.Module):
    """(name, node) of every module-level function and every method, `Class.method`."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            yield from members(node.name, node)


def members(name: str, node: ast.AST):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        yield name, node
        return
    for child in node.body:
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{name}.{child.name}", child


def definitions(tree: ast.Module) -> dict[str, ast.AST]:
    return {node.name: node for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _parallel_statements(body: list[ast.stmt], tokens) -> list[ast.stmt]:
    """The statements of `body` on the parallel code paths: those that name a token, and the parallel branch of an
    `if` that tests one (its `else` when the test is `X is None`)."""
    found = []
    for stmt in body:
        if isinstance(stmt, ast.If) and _mentions(stmt.test, tokens):
            found.extend(stmt.orelse if _tests_none(stmt.test, tokens) else stmt.body)
            found.extend(_parallel_statements(stmt.body if _tests_none(stmt.test, tokens) else stmt.orelse, tokens))
        elif _is_compound(stmt) and any(_mentions(part, tokens) for part in _header(stmt)):
            found.append(stmt)
        elif _is_compound(stmt):
            for inner in _bodies(stmt):
                found.extend(_parallel_statements(inner, tokens))
        elif _mentions(stmt, tokens):
            found.append(stmt)
    return found


def _is_compound(stmt: ast.stmt) -> bool:
    return bool(_bodies(stmt))


def _bodies(stmt: ast.stmt) -> list[list[ast.stmt]]:
    bodies = [getattr(stmt, name, None) for name in ("body", "orelse", "finalbody")]
    bodies += [handler.body for handler in getattr(stmt, "handlers", [])]
    bodies += [case.body for case in getattr(stmt, "cases", [])]
    return [body for body in bodies if isinstance(body, list) and body and isinstance(body[0], ast.stmt)]


def _header(stmt: ast.stmt) -> list[ast.AST]:
    """The parts of a compound statement outside its bodies (a `for`'s target and iterable, a `with`'s items)."""
    inside = {id(s) for body in _bodies(stmt) for s in body}
    return [child for child in ast.iter_child_nodes(stmt) if id(child) not in inside]


def _mentions(node: ast.AST, tokens) -> bool:
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and child.id in tokens:
            return True
        if isinstance(child, ast.Attribute) and child.attr in tokens:
            return True
        if isinstance(child, ast.keyword) and child.arg in tokens:
            return True
    return False


def _tests_none(test: ast.expr, tokens) -> bool:
    """Whether the test holds when the configuration is absent (`X is None`, alone or in an `and`)."""
    parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    return any(isinstance(part, ast.Compare) and len(part.ops) == 1 and isinstance(part.ops[0], ast.Is)
               and isinstance(part.comparators[0], ast.Constant) and part.comparators[0].value is None
               and _mentions(part.left, tokens) for part in parts)


def names_read(stmt: ast.AST) -> set[str]:
    """The names a statement reads (a function it calls, a class it applies), not those it assigns."""
    return {child.id for child in ast.walk(stmt) if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load)}


def _lines(body: list[ast.stmt]) -> set[int]:
    """The first line of every statement in `body`, nested ones included (a nested `def` by its decorators too)."""
    lines = set()
    for stmt in body:
        for child in ast.walk(stmt):
            if isinstance(child, ast.stmt):
                lines.add(child.lineno)
                lines.update(d.lineno for d in getattr(child, "decorator_list", []))
    return lines


def _imported_from(tree: ast.Module, me: str, whole: set[str]) -> set[str]:
    """Names this module imports from the modules measured whole: calling one is parallel code."""
    package = me.rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            source = _absolute(node.module, node.level, package)
            if source in whole and source != me:
                names.update(alias.asname or alias.name for alias in node.names)
    return names


def _absolute(module: str, level: int, package: str) -> str:
    if level == 0:
        return module
    base = package.split(".")
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, module])


def _dotted(path: Path, root: Path) -> str:
    return "diffusers." + ".".join(path.relative_to(root).with_suffix("").parts)
