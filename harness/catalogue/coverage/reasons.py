"""Why a statement of diffusers' parallel code never ran in a plan: every one gets a reason, in this order.

1. CUDA-only: the function is reached only through attention backends that do not run on this machine (read from
   diffusers' registry and the source: which registered backend functions call it, transitively), on this machine
   the harness's CPU shims stand in for it (its op has no CPU kernel), or a rule says only another machine reaches
   it (`Reach.category`).
2. Refused by diffusers: the statement is part of a `raise` (its block ends in one): diffusers' own refusal, with its
   message, that no case of the plan provokes.
3. Not in this plan: a value of an axis reaches it (`REACH`, below) and the plan did not run that value, or it is
   something no case of the harness does (said in words). Where the plan did run that value and the statement still
   never ran, the rule does not explain it: unknown, saying so.
4. Unknown: nothing above explains it.

`REACH` names, per function (and branch), what reaches it, as read from diffusers 0.42.1 and its full plan: a rule
that matches no function of the installed diffusers is harmless (releases differ), and one whose axis does not exist
yet (the load axis `pretrained`) says so.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
from dataclasses import dataclass, field

from harness.catalogue.coverage.scope import ModuleScope, definitions, functions_of, names_read
from harness.core.coverage import CUDA_ONLY, NOT_IN_PLAN, REFUSED, UNKNOWN, Gap


@dataclass(frozen=True)
class Reach:
    """What runs the statements of `where` (a glob over `<module key>:<function>`), in words (`what`): a case whose
    axis values match each (axis, glob) of `when`; with no `when`, something no case of the harness does. `inside`:
    only the statements under an `if` that tests this name (its true branch)."""

    where: str
    what: str
    when: tuple[tuple[str, str], ...] = ()
    inside: str = ""
    category: str = NOT_IN_PLAN  # CUDA_ONLY where only another machine's device or collectives would reach it


ANY_ULYSSES = ("the layout `ulysses2any` (Ulysses-anything shards and gathers unevenly)", (("layout", "ulysses*any"),))
ANY_RING = ("the layout `ring2any` (ring-anything)", (("layout", "ring*any"),))
UNIFIED = ("the layout `ring2xulysses2` (ring and Ulysses together)", (("layout", "ring*xulysses*"),))
TRAIN = ("the kind `train` (a backward pass)", (("kind", "train"),))
PRETRAINED = ("the load axis `pretrained` (from_pretrained(..., parallel_config=...))", (("load", "pretrained"),))
REMOVAL = ("the kind `removal` (enable, run, remove_context_parallel, run)", (("kind", "removal"),))
# what no case does (no `when`), each said as what would reach it; checked against diffusers 0.42.1's full plan
LSE = "a caller asking for the log-sum-exp (return_lse=True): no model of diffusers does, only the ring's own calls"
REACH = (
    Reach("models/attention_dispatch.py:*", LSE, inside="return_lse"),
    Reach("models/attention_dispatch.py:TemplatedUlyssesAnythingAttention.forward", "a text mask over an uneven "
          "sequence under Ulysses-anything: no shape of the zoo has both (its masked shapes have even text)",
          inside="max_local"),
    Reach("models/attention_dispatch.py:TemplatedRingAnythingAttention.forward", "the layout `ring2any` on an uneven "
          "sequence (the shape `txt7`: each rank's K/V padded to the longest)", (("layout", "ring*any"),
                                                                                  ("shape", "txt7"))),
    Reach("hooks/context_parallel.py:ContextParallelSplitHook._prepare_cp_input", "the model `wan` (a 1-D timestep "
          "against its plan's expected_dims 2: diffusers warns and leaves it whole)", (("model", "wan"),)),
    Reach("models/attention_dispatch.py:_maybe_*pad_*_head", "a model whose heads Ulysses-anything pads (3 heads at "
          "degree 2; measured to match one device within 2.4e-7): every model of the zoo has 4 (ulysses3any is "
          "refused: it would pad 2 for 2 a rank)"),
    Reach("models/attention_dispatch.py:_all_to_all_dim_exchange", "a Ulysses group of one rank: every layout's "
          "degree is at least 2"),
    Reach("hooks/context_parallel.py:ModuleForwardMetadata._get_parameter_from_args_kwargs", "a model whose planned "
          "modules take a split input positionally (helios' attention and feed-forward)", (("model", "helios*"),)),
    Reach("hooks/context_parallel.py:ContextParallelSplitHook.pre_forward", "a `_cp_plan` input that is a list of "
          "tensors, split one by one: no model of the zoo has one", inside="tuple"),
    Reach("hooks/context_parallel.py:ContextParallelSplitHook.pre_forward", "a model whose planned modules take a "
          "split input positionally (helios' attention and feed-forward)", (("model", "helios*"),)),
    Reach("hooks/context_parallel.py:ContextParallelGatherHook.post_forward", "a gathered module that returns several "
          "outputs (a list of ContextParallelOutput, some None): no model of the zoo gathers one"),
    Reach("hooks/context_parallel.py:AllGatherAnythingFunction.backward", "the kind `train` under a *any layout: the "
          "train kind skips them, diffusers' any attention has no backward", (("kind", "train"), ("layout", "*any"))),
    Reach("hooks/tensor_parallel.py:_resolve_tp_plan", "a `_tp_plan` key without a `*`: every tensor-parallel model "
          "of the zoo names its blocks with one"),
    Reach("hooks/tensor_parallel.py:_*tensor_parallel", "a tensor-parallel model group-offloaded or saved "
          "(enable_group_offload, save_pretrained): no case does"),
    Reach("models/modeling_utils.py:ModelMixin.enable_group_offload", "a tensor-parallel model group-offloaded: no "
          "case does"),
    Reach("hooks/tensor_parallel.py:_check_tp_supported", "peft installed (the LoRA-adapter refusal runs only with "
          "it): not a dependency of the harness", inside="is_peft_available"),
    Reach("models/modeling_utils.py:ModelMixin.enable_parallelism", "an attention processor without a backend or a "
          "`_parallel_config`: every processor of the zoo has both", inside="processor"),
    Reach("hooks/context_parallel.py:PartitionAnythingSharder.*", *ANY_ULYSSES),
    Reach("hooks/context_parallel.py:AllGatherAnythingFunction.forward", *ANY_ULYSSES),
    Reach("hooks/context_parallel.py:_all_gather_anything", *ANY_ULYSSES),
    Reach("hooks/context_parallel.py:_fill_gather_shapes", *ANY_ULYSSES),
    Reach("models/_modeling_parallel.py:gather_size_by_comm", *ANY_ULYSSES),
    Reach("models/attention_dispatch.py:TemplatedUlyssesAnythingAttention.forward", *ANY_ULYSSES),
    Reach("models/attention_dispatch.py:all_to_all_single_any_*", *ANY_ULYSSES),
    Reach("models/attention_dispatch.py:ulysses_anything_metadata", *ANY_ULYSSES),
    Reach("models/attention_dispatch.py:_maybe_*pad_*_head", *ANY_ULYSSES),
    Reach("models/attention_dispatch.py:TemplatedRingAnythingAttention.forward", *ANY_RING),
    Reach("models/attention_dispatch.py:_templated_unified_attention", *UNIFIED),
    Reach("*:*.backward", *TRAIN),
    Reach("models/attention_dispatch.py:*_backward_op", *TRAIN),
    Reach("hooks/context_parallel.py:remove_context_parallel", *REMOVAL),
    Reach("hooks/tensor_parallel.py:apply_tensor_parallel", "the `neuron` tensor-parallel backend (AWS Neuron "
          "devices)", inside="backend", category=CUDA_ONLY),
    Reach("models/modeling_utils.py:ModelMixin.save_pretrained", "save_pretrained of a model before parallelism: "
          "the harness saves the run's checkpoints in its parent process, once, before the launches, and --coverage "
          "measures only the ranks"),
    Reach("models/modeling_utils.py:ModelMixin.from_pretrained", "a TensorParallelConfig of degree 1 (nothing to "
          "shard): every tensor-parallel layout has degree 2 or more", inside="tp_degree"),
    Reach("models/modeling_utils.py:ModelMixin.from_pretrained", "parallel loading switched on "
          "(HF_ENABLE_PARALLEL_LOADING) for a tensor-parallel load: the harness leaves it off",
          inside="is_parallel_loading_enabled"),
    Reach("models/modeling_utils.py:ModelMixin.from_pretrained", "a tensor-parallel load of a checkpoint in one "
          "safetensors file: the harness saves its checkpoints sharded (a shard of one weight in another file than "
          "the next's)", inside="tp_shard_specs"),
    Reach("models/modeling_utils.py:ModelMixin.from_pretrained", *PRETRAINED),
    Reach("models/modeling_utils.py:ModelMixin._load_pretrained_model", *PRETRAINED),
    Reach("hooks/tensor_parallel.py:_hooks_only_styles", *PRETRAINED),
    Reach("hooks/tensor_parallel.py:_check_tp_weights_format", *PRETRAINED),
    Reach("hooks/tensor_parallel.py:apply_tensor_parallel", *PRETRAINED),
)


@dataclass
class Facts:
    """What the plan ran and what this machine has, for the reasons: the axis values of every case that ran (not
    SKIP), each attention backend that does not run here with why and the function each backend name holds
    (diffusers' registry names), and the functions the harness's CPU shims stand in for (`<module key>:<name>`)."""

    cases: list[dict[str, str]] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)
    backends: dict[str, str] = field(default_factory=dict)
    replaced: dict[str, str] = field(default_factory=dict)
    axes: tuple[str, ...] = ()  # the harness's axes (an axis a rule names that is not among them is not here yet)


def classify(module: ModuleScope, function: str, missing: list[int], facts: Facts, rules=REACH) -> list[Gap]:
    """The gaps of one function: its never-executed lines grouped by reason, in line order."""
    if not missing:
        return []
    cuda = facts.replaced.get(f"{module.key}:{function}") or _cuda_only(module, function, facts)
    node = dict(functions_of(module.tree)).get(function) if module.tree is not None else None
    raising, tested = _raising_lines(node), _tested(node)
    matching = [r for r in rules if fnmatch.fnmatchcase(f"{module.key}:{function}", r.where)]
    gaps: list[Gap] = []
    for line in missing:
        rule = next((r for r in matching if not r.inside or r.inside in tested.get(line, ())), None)
        category, why = _reason(line, cuda, raising, rule, facts)
        if gaps and gaps[-1].category == category and gaps[-1].why == why:
            gaps[-1].lines.append(line)
        else:
            gaps.append(Gap([line], category, why))
    return gaps


def _reason(line: int, cuda: str | None, raising: dict[int, str], rule: Reach | None,
            facts: Facts) -> tuple[str, str]:
    if cuda is not None:
        return CUDA_ONLY, cuda
    reach = _reach(rule, facts) if rule is not None else None
    if line in raising:
        return REFUSED, raising[line] + (f"; {reach[1]}" if reach else "; no case of this plan provokes it")
    if reach is not None:
        return reach
    return UNKNOWN, "nothing the harness knows reaches it"


def _reach(rule: Reach, facts: Facts) -> tuple[str, str]:
    if not rule.when:
        return rule.category, rule.what
    missing = [axis for axis, _ in rule.when if facts.axes and axis not in facts.axes]
    if missing:
        return NOT_IN_PLAN, f"{rule.what} (no such axis in this harness yet)"
    if any(all(fnmatch.fnmatchcase(case.get(axis, ""), glob) for axis, glob in rule.when) for case in facts.cases):
        return UNKNOWN, f"{rule.what} ran and did not reach it"
    return NOT_IN_PLAN, rule.what


def _tested(node: ast.AST | None) -> dict[int, set[str]]:
    """For each line of a function, the names tested by the `if`s whose true branch holds it, or that it tests."""
    found: dict[int, set[str]] = {}
    if node is None:
        return found
    for child in ast.walk(node):
        if isinstance(child, ast.If):
            names = {n.id for n in ast.walk(child.test) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(child.test) if isinstance(n, ast.Attribute)}
            found.setdefault(child.lineno, set()).update(names)  # the test itself: an `elif` runs only there
            for stmt in child.body:
                for inner in ast.walk(stmt):
                    if isinstance(inner, ast.stmt):
                        found.setdefault(inner.lineno, set()).update(names)
    return found


# --- CUDA-only: which backends reach a function ------------------------------------------------------------------


def _cuda_only(module: ModuleScope, function: str, facts: Facts) -> str | None:
    """Why the function runs only on backends this machine lacks, or None (some backend that runs here reaches it,
    or none does)."""
    if module.tree is None:
        return None
    reaching = _reaching(module.tree, tuple(sorted(facts.backends.items()))).get(function.partition(".")[0], set())
    if not reaching or any(name not in facts.unavailable for name in reaching):
        return None
    names = sorted(reaching)
    shown = ", ".join(f"`{name}`" for name in names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    first = facts.unavailable[names[0]]
    return f"only {shown} reach it, none runs here (`{names[0]}`: {first[:80]}{'...' if len(first) > 80 else ''})"


@functools.lru_cache(maxsize=8)
def _reaching(tree: ast.Module, backends: tuple[tuple[str, str], ...]) -> dict[str, set[str]]:
    """`backends_reaching`, once per module and registry (every function of the module asks)."""
    return backends_reaching(tree, dict(backends))


def backends_reaching(tree: ast.Module, backends: dict[str, str]) -> dict[str, set[str]]:
    """For each module-level function or class of a module: the registered backends whose function calls it,
    directly or through other functions of the module (a backend's own function is reached by that backend)."""
    defs = definitions(tree)
    reached: dict[str, set[str]] = {}
    for backend, name in backends.items():
        if name not in defs:
            continue
        seen, todo = {name}, [name]
        while todo:
            node = defs[todo.pop()]
            for called in names_read(node) & set(defs) - seen:
                seen.add(called)
                todo.append(called)
        for found in seen:
            reached.setdefault(found, set()).add(backend)
    return reached


# --- refusals: the statements of a raise ---------------------------------------------------------------------------


def _raising_lines(node: ast.AST | None) -> dict[int, str]:
    """Each line of the function that belongs to a block ending in a `raise`, with diffusers' refusal in words."""
    found: dict[int, str] = {}
    if node is None:
        return found
    for block in _blocks(node):
        if block and isinstance(block[-1], ast.Raise):
            text = refusal_text(block[-1])
            for stmt in block:
                for child in ast.walk(stmt):
                    if isinstance(child, ast.stmt):
                        found.setdefault(child.lineno, text)
    return found


def _blocks(node: ast.AST):
    for child in ast.walk(node):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(child, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block
        for handler in getattr(child, "handlers", []):
            yield handler.body


def refusal_text(node: ast.Raise) -> str:
    """`ValueError: "message"`, the message's literal parts kept and each formatted value shown as `{...}`."""
    exc = node.exc
    if isinstance(exc, ast.Call):
        name = ast.unparse(exc.func)
        message = _literal(exc.args[0]) if exc.args else ""
        return f"{name}: \"{message}\"" if message else name
    return ast.unparse(exc) if exc is not None else "re-raise"


def _literal(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "{...}" for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _literal(node.left) + _literal(node.right)
    return "{...}"
