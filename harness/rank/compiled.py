"""A case's model under torch.compile, and the proof of what the compiled artifact contains.

The proof recorder (harness.rank.recorder) cannot serve a compiled run: Dynamo traces its function mode into the
model's code (its SDPA selection is a graph break of its own), and a dispatch mode sees nothing inside a compiled
graph. So the compiler's backend is wrapped instead: every graph Dynamo hands it goes through AOTAutograd, and the
ATen graphs that come out (what aot_eager runs, what Inductor generates code from) are read before they are handed
on: the attention kernels, the collectives, and the module each op came from (`nn_module_stack`, the graph's own
record). Each graph counts its executions, so the proof of the measured run is its graphs' contents times the
times they ran. How often each module is called, what the prediction is scaled by, comes from the same run with
compilation set aside (`torch.compiler.set_stance("force_eager")`) under the eager recorder: the model calls its
modules alike either way, and a hook inside a compiled graph would change the graph it counts.

The backward of a compiled training step is proven as an eager one is: it runs under the eager recorder's dispatch
mode, which sees every op the backward dispatches, those of the compiled backward graphs (AOTAutograd's, run op by
op by aot_eager, and Inductor's calls to collectives and to fallback attention kernels) and those diffusers'
context-parallel backward runs in Python between them (an autograd.Function Dynamo does not put in a graph: a
reader of the backward graphs alone found none of its all-to-alls). The compiled forward never runs under that mode.

A graph's module names are relative to the frame Dynamo compiled it from, which is not always the model's own: a
repeated block (regional compilation), or a frame Dynamo compiled on its own after a graph break. So each execution
also names the module it ran in, the innermost module of the model whose method is on the Python stack, and the
graph's names are read under it. What the graphs cannot show is said in `notes`.

What runs outside every graph in the measured run is the compiled model's too: a function diffusers' hooks wrap in
`torch.compiler.disable` (MagCache's and SeaCache's block hooks run whole blocks there), or the eager code between
the graphs of a break (layerwise casting's hook builds a Parameter, a break each time). A dispatch mode that steps
aside while Dynamo compiles (`ignore_compile_internals`) and while a graph or the recorded backward runs sees those
ops one by one, and names each by the innermost module on the Python stack: the eager remainder of the proof.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections import Counter, defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.core.modes import Mode, mode_of
from harness.rank import comms, kernels
from harness.rank.recorder import BACKWARD, RunRecorder, is_dtensor

_SDPA = torch.nn.functional.scaled_dot_product_attention  # the builtin Dynamo records, whatever wraps it
# How Dynamo names the compiled module itself in nn_module_stack, and a submodule reached by item.
_ROOT = re.compile(r"^\.?(L\['[^']*'\]|forward\.__self__|self\b)")
_ITEM = re.compile(r"\.?(?:__dict__\['_modules'\]|_modules)\['([^']*)'\]|\[(\d+)\]")
# diffusers' hooks wrap a module's forward (`forward.__self__`, or through closures of wrapped forwards).
_HOOKED = re.compile(r"\.(?:original_)?forward(?:\.func\.__closure__\.\d+\.cell_contents\.(?:original_)?forward)*"
                     r"\.__self__")
PROOF_NOTE = ("kernels and collectives read from the ATen graphs the compiler was handed, times each graph's "
              "executions in the measured run, by the module of each op's nn_module_stack")
REMAINDER_NOTE = ("the rest ran outside every compiled graph (a function diffusers' hooks keep from torch.compile, or "
                  "the eager code of a graph break) and was recorded op by op as it ran, by the module on the Python "
                  "stack")
INDUCTOR_NOTE = ("Inductor generates code from those graphs: an attention op is proven to be in the graph it compiled, "
                 "not that Inductor kept its kernel")


class CompiledRun:
    """`CompiledRun(mode).compile(module)`; run it once (the compile); then `with compiled: run()` is the measured
    run, after which `executed()`, `recorded()`, `calls` and `figures()` describe it."""

    def __init__(self, mode: Mode):
        self.mode = mode
        self.graphs: list[_Graph] = []
        self.measured_from = None  # how many graphs existed when the measured run began (None: not begun)
        self.measuring = False  # graph executions count only inside `with compiled:` (train: step 1 only)
        self.calls: dict[str, int] = {}
        self.context_calls: dict[str, int] = {}
        self.break_reasons: dict[str, int] = {}  # Dynamo's reason for each graph break -> times
        self.names: dict[int, str] = {}  # id of each module of the compiled model -> its name there
        self.regions: list[str] = [""]  # the modules compiled ("": the model)
        self.outside: list[str] = []  # predicted exchanges outside them (in_graphs)
        self.backward = None  # the measured run's backward, recorded op by op (a RunRecorder, once compiled)
        self.inside = 0  # > 0 while a compiled graph or the recorded backward runs (the remainder looks away)
        self.remainder = _Remainder(self)  # what runs outside every graph in the measured run
        fresh_compiler()

    def compile(self, module: torch.nn.Module) -> None:
        """In place: whole (nn.Module.compile), or each repeated block (diffusers' compile_repeated_blocks);
        every graph through `backend`."""
        self.prepare(module)
        _compile(module, self.mode, self.backend)

    def prepare(self, module: torch.nn.Module) -> None:
        """What reading the graphs of `module` needs, once its layout is applied: compiled here (`compile`), or
        already by a user's call given `backend` (a flow that compiles, harness.flows.compiling)."""
        self.names = {id(sub): name for name, sub in module.named_modules()}
        self.backward = RunRecorder(module)
        blocks = getattr(module, "_repeated_blocks", None) or ()
        self.regions = [name for name, sub in module.named_modules() if type(sub).__name__ in blocks] \
            if self.mode.regional else [""]

    def in_graphs(self, expected: list) -> list:
        """The predicted exchanges of modules the compiled graphs cover (regional: inside a repeated block); the
        others run eager between the graphs, where the reader sees nothing, and are named in the notes."""
        inside = [item for item in expected if item.module == BACKWARD or any(
            item.module == region or item.module.startswith(f"{region}.") or not region for region in self.regions)]
        self.outside = sorted({f"{item.module} {item.collective}" for item in expected if item not in inside})
        return inside

    def count_calls(self, built) -> None:
        """Each module's calls (and those given a `comms.CONTEXT` tensor): the kind's recorded run once, eager."""
        recorder = RunRecorder(built.module, built.kernel_scope)
        with torch.compiler.set_stance("force_eager"):
            built.run_recorded(recorder)
        self.calls, self.context_calls = dict(recorder.calls), dict(recorder.context_calls)

    def backend(self, gm: torch.fx.GraphModule, example_inputs):
        graph = _Graph(len(self.graphs))
        # A graph of nothing but the harness's own count (harness::dispatched, where a graph break left the frame
        # that dispatches nothing else) is the harness's, not the model's: it runs and counts, but is no graph of
        # the figures.
        graph.model_ops = any(node.op == "call_function" and not str(node.target).startswith("harness.")
                              for node in gm.graph.nodes)
        self.graphs.append(graph)
        compiled = self._inner(graph)(gm, example_inputs)
        graph.math_calls(sum(node.op == "call_function" and node.target is _SDPA for node in gm.graph.nodes))

        def run(*args):
            if self.measuring:
                graph.runs[self._running_in()] += 1
            self.inside += 1
            try:
                return compiled(*args)
            finally:
                self.inside -= 1

        return run

    def _inner(self, graph: _Graph):
        """The mode's compiler with `graph` reading each ATen graph it is handed (forward, backward) first."""
        from torch._dynamo.backends.common import aot_autograd

        if self.mode.backend == "aot_eager":
            from torch._dynamo.backends.debugging import boxed_nop
            from torch._functorch.partitioners import min_cut_rematerialization_partition

            def forward(gm, inputs):
                graph.read(gm)
                return boxed_nop(gm, inputs)

            return aot_autograd(fw_compiler=forward, bw_compiler=boxed_nop,
                                partition_fn=min_cut_rematerialization_partition,
                                keep_inference_input_mutations=True)
        from torch._functorch import config as functorch_config
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner

        def inner(gm, inputs, **kwargs):
            if not kwargs.get("is_backward"):  # the backward is recorded as it runs (`_backward_recorded`)
                graph.read(gm)
            return compile_fx_inner(gm, inputs, **kwargs)  # Inductor's FX graph cache still serves its code

        def inductor(gm, inputs):
            # A hit of AOTAutograd's cache hands back compiled code without the graph: the proof would have none.
            with functorch_config.patch(enable_autograd_cache=False):
                return compile_fx(gm, inputs, inner_compile=inner)

        return inductor

    def __enter__(self) -> CompiledRun:
        self.measured_from, self.measuring = len(self.graphs), True
        for graph in self.graphs:
            graph.runs.clear()
        self._recording_backward = self._backward_recorded()
        self._recording_backward.__enter__()
        self.remainder.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.remainder.__exit__(*exc)
        self._recording_backward.__exit__(*exc)
        self.measuring = False  # what runs after (a train case's later steps) is not in the proof
        # Dynamo's counters are global: the breaks are this case's when its run ends (the next case clears them).
        self.break_reasons = {_first_line(reason): count
                              for reason, count in torch._dynamo.utils.counters["graph_break"].items()}

    @contextlib.contextmanager
    def _backward_recorded(self):
        """Every backward started in the measured run runs under the recorder's dispatch mode (see the module's
        docstring); the forward, compiled, never does."""
        original = torch.autograd.backward

        def backward(*args, **kwargs):
            self.inside += 1
            try:
                with self.backward.dispatched:
                    return original(*args, **kwargs)
            finally:
                self.inside -= 1

        torch.autograd.backward = backward
        try:
            yield
        finally:
            torch.autograd.backward = original

    def _running_in(self, depth: int = 2) -> str:
        """The model's innermost module whose method called the graph or op now running (`self` of a frame out from
        here: the frame Dynamo compiled, or one out from it; or `module`, what diffusers' hooks call the module they
        run for); the model itself ("") when none is."""
        frame = sys._getframe(depth)
        while frame is not None:
            local = frame.f_locals
            name = self.names.get(id(local.get("self")), self.names.get(id(local.get("module"))))
            if name is not None:
                return name
            frame = frame.f_back
        return ""

    def executed(self) -> dict[str, int]:
        """The attention kernels of the measured run (as harness.rank.recorder writes them)."""
        total: Counter = Counter(self.backward.kernels if self.backward is not None else {})
        total.update(self.remainder.kernels)
        for graph in self.graphs:
            for name, count in graph.kernels.items():
                total[name] += count * graph.executions
        return dict(sorted(total.items()))

    def recorded(self) -> dict[str, dict[str, list[int]]]:
        """module -> collective -> [count, bytes] of the measured run, as harness.rank.recorder writes them."""
        table: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
        for graph in self.graphs:
            for base, runs in graph.runs.items():
                for (module, collective), (count, size) in graph.collectives.items():
                    entry = table[_under(base, module)][collective]
                    entry[0] += count * runs
                    entry[1] += size * runs
        for recorded in ((self.backward.table if self.backward is not None else {}), self.remainder.table):
            for module, row in recorded.items():
                for collective, (count, size) in row.items():
                    table[module][collective][0] += count
                    table[module][collective][1] += size
        return {module: dict(sorted(row.items())) for module, row in sorted(table.items())}

    def figures(self) -> dict:
        """What the compile made (after the measured run): graphs, graph breaks with Dynamo's reasons, recompiles
        in the measured run, and how often each graph ran in it."""
        reasons = self.break_reasons
        own = [graph for graph in self.graphs if graph.model_ops]
        before = len(own) if self.measured_from is None else sum(graph.model_ops
                                                                  for graph in self.graphs[:self.measured_from])
        return {"mode": self.mode.name, "graphs": len(own), "graph_breaks": sum(reasons.values()),
                "break_reasons": reasons, "recompiles": len(own) - before,
                "executions": [graph.executions for graph in own], "notes": self.notes()}

    def notes(self) -> list[str]:
        """The parts of the proof a compiled run gives differently from an eager one, said with every case."""
        notes = [PROOF_NOTE]
        if self.remainder.table or self.remainder.kernels:
            notes.append(REMAINDER_NOTE)
        if self.outside:
            notes.append(f"regional compilation compiles the repeated blocks only: {', '.join(self.outside)} run(s) "
                         "eager between the graphs, where the graph reader sees nothing; not checked")
        if self.mode.backend == "inductor":
            notes.append(INDUCTOR_NOTE)
        return notes


def fresh_compiler() -> None:
    """Dynamo's caches and counters emptied: the graphs compiled next are the run's own (and a block class compiled
    by earlier cases cannot reach its recompile limit and fall back to eager)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


def compile_like(mode_name: str, module: torch.nn.Module) -> None:
    """Compile `module` in place as a case of mode `mode_name` is, without recording (a single-device baseline)."""
    mode = mode_of(mode_name)
    if mode.backend is not None:
        fresh_compiler()
        _compile(module, mode, mode.backend)


def compile_regions(mode_name: str, module: torch.nn.Module) -> str:
    """Compile each repeated block of `module` in place with mode `mode_name`'s backend (the whole model when it
    declares no repeated blocks); returns what was compiled, in words."""
    mode = mode_of(mode_name)
    torch._dynamo.reset()
    blocks = getattr(module, "_repeated_blocks", None)
    if blocks and hasattr(module, "compile_repeated_blocks"):
        module.compile_repeated_blocks(backend=mode.backend)
        return f"each repeated block ({', '.join(blocks)})"
    module.compile(backend=mode.backend)
    return "the whole model (it declares no repeated blocks)"


def _compile(module: torch.nn.Module, mode: Mode, backend) -> None:
    if mode.regional:
        module.compile_repeated_blocks(backend=backend)
    else:
        module.compile(backend=backend)


class _Remainder(TorchDispatchMode):
    """The measured run's ops that no compiled graph ran: collectives and attention kernels, each under the module
    on the Python stack (`CompiledRun._running_in`). Off while Dynamo compiles, and while a graph or the recorded
    backward runs (their ops are counted from the graphs and by the backward's own recorder)."""

    supports_higher_order_operators = True

    def __init__(self, run: CompiledRun):
        super().__init__()
        self.run = run
        self.kernels: Counter = Counter()
        self.table: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # Dynamo compiles under it, as with no mode (a user mode makes Dynamo leave every frame eager)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.run.inside:
            return func(*args, **kwargs)
        if isinstance(func, torch._ops.HigherOrderOperator):
            name = kernels.kernel_of_operator(func.name())
            if name is not None:
                self.kernels[name] += 1
            return func(*args, **kwargs)
        if any(t is not torch.Tensor and is_dtensor(t) for t in types):
            return NotImplemented  # DTensor desugars into plain ops that come back here
        collective = comms.collective_of(func)
        if collective is not None:
            entry = self.table[self.run._running_in(3)][collective]
            entry[0] += 1
            entry[1] += comms.payload_bytes(func, args, kwargs)
        elif (name := kernels.kernel_of_operator(func._schema.name)) is not None:
            self.kernels[name] += 1
        return func(*args, **kwargs)


class _Graph:
    """One Dynamo graph as its ATen graphs hold it: attention kernels and collectives per module."""

    def __init__(self, index: int):
        self.index = index
        self.runs: Counter = Counter()  # executions in the measured run, by the module each ran in
        self.model_ops = True  # False: it holds only the harness's counting ops
        self.kernels: Counter = Counter()
        self.collectives: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])

    @property
    def executions(self) -> int:
        return sum(self.runs.values())

    def read(self, gm: torch.fx.GraphModule) -> None:
        """A forward ATen graph: its attention kernels and collectives, by the module each op came from."""
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            stack = node.meta.get("nn_module_stack") or {}
            self._op(node, _module(list(stack.values())[-1][0]) if stack else "")

    def math_calls(self, sdpa_calls: int) -> None:
        """SDPA's math path is a composite that AOTAutograd decomposes into plain ops: a Dynamo-level SDPA call
        with no fused kernel beneath it in the ATen graph ran math (as harness.rank.recorder tells it in eager)."""
        fused = sum(count for name, count in self.kernels.items() if name in kernels.SDPA_KERNELS)
        if sdpa_calls > fused:
            self.kernels[kernels.MATH] += sdpa_calls - fused

    def _op(self, node, module: str) -> None:
        target = node.target
        if isinstance(target, torch._ops.HigherOrderOperator):
            name = kernels.kernel_of_operator(target.name())
            if name is not None:
                self.kernels[name] += 1
            return
        if not isinstance(target, torch._ops.OpOverload):
            return
        collective = comms.collective_of(target)
        if collective is not None:
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda arg: arg.meta.get("val"))
            entry = self.collectives[module, collective]
            entry[0] += 1
            entry[1] += _size_hint(comms.payload_bytes(target, args, kwargs))
        elif (name := kernels.kernel_of_operator(target._schema.name)) is not None:
            self.kernels[name] += 1


def _size_hint(size) -> int:
    """A graph Dynamo made shape-dynamic (a frame called with other sizes: Wan's self- and cross-attention share
    the attention function's graph) has symbolic sizes; the bytes are then those of the example it was compiled
    for (a record must hold plain numbers: a symbolic one drags its fake tensors into the case's record)."""
    if isinstance(size, torch.SymInt):
        hint = size.node.hint
        return int(hint) if hint is not None else 0
    return int(size)


def _under(base: str, module: str) -> str:
    """A graph's module name (relative to its frame's module) as the model names it; backward stays as it is."""
    if not base or module.startswith("("):
        return module
    return f"{base}.{module}" if module else base


def _module(path: str) -> str:
    """The module's name in the compiled module, from how Dynamo wrote its source: `L['self'].blocks.0.attn`, or
    through diffusers' hooks (which wrap `forward`) `forward.__self__.__dict__['_modules']['blocks'].0.attn`."""
    path = _ITEM.sub(lambda match: "." + (match[1] or match[2]), path)
    path = _HOOKED.sub("", path)
    while (shorter := _ROOT.sub("", path)) != path:
        path = shorter
    return path.strip(".")


def _first_line(reason: str) -> str:
    return reason.strip().splitlines()[0] if reason.strip() else reason
