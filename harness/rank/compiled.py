"""A case's model under torch.compile, and the proof of what the compiled artifact contains.

The proof recorder (harness.rank.recorder) cannot serve a compiled run: Dynamo traces its function mode into the
model's code (its SDPA selection is a graph break of its own), and a dispatch mode sees nothing inside a compiled
graph. So the compiler's backend is wrapped instead: every graph Dynamo hands it goes through AOTAutograd, and the
ATen graphs that come out (what aot_eager runs, what Inductor generates code from) are read before they are handed
on: the attention kernels, the collectives, and the module each op came from (`nn_module_stack`, the graph's own
record; a module's calls are its distinct entries there). Each graph counts its executions, so the proof of the
measured run is its graphs' contents times the times they ran. What the graphs cannot show is said in `notes`.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict

import torch

from harness.core.modes import Mode, mode_of
from harness.rank import backends, comms, kernels

BACKWARD = "(backward)"
_SDPA = torch.nn.functional.scaled_dot_product_attention  # the builtin Dynamo records, whatever wraps it
# How Dynamo names the compiled module itself in nn_module_stack, and a submodule reached by item.
_ROOT = re.compile(r"^\.?(L\['[^']*'\]|forward\.__self__|self\b)")
_ITEM = re.compile(r"\.?(?:__dict__\['_modules'\]|_modules)\['([^']*)'\]|\[(\d+)\]")
PROOF_NOTE = ("kernels and collectives read from the ATen graphs the compiler was handed, times each graph's "
              "executions in the measured run, by the module of each op's nn_module_stack")
INDUCTOR_NOTE = ("Inductor generates code from those graphs: an attention op is proven to be in the graph it compiled, "
                 "not that Inductor kept its kernel")
CROSS_ATTENTION_NOTE = ("under compile the graphs do not tell a call given encoder_hidden_states from one without: "
                        "every attention call is predicted to exchange over split keys")


class CompiledRun:
    """`CompiledRun(mode).compile(module)`; run it once (the compile); then `with compiled: run()` is the measured
    run, after which `executed()`, `recorded()`, `calls` and `figures()` describe it."""

    def __init__(self, mode: Mode):
        self.mode = mode
        self.graphs: list[_Graph] = []
        self.measured_from = None  # how many graphs existed when the measured run began (None: not begun)
        self.calls: dict[str, int] = defaultdict(int)
        self.context_calls: dict[str, int] = {}  # not visible in a graph (CROSS_ATTENTION_NOTE)
        self.break_reasons: dict[str, int] = {}  # Dynamo's reason for each graph break -> times
        torch._dynamo.reset()  # a fresh cache per case: its graphs are this case's own
        torch._dynamo.utils.counters.clear()
        backends.traced_into(None)  # notes left by an earlier compile (a baseline's) are not this case's

    def compile(self, module: torch.nn.Module) -> None:
        """In place (nn.Module.compile), whole; every graph through `backend`."""
        module.compile(backend=self.backend)

    def backend(self, gm: torch.fx.GraphModule, example_inputs):
        graph = _Graph(len(self.graphs))
        graph.dispatched, graph.functions = backends.traced_into(gm.graph)
        self.graphs.append(graph)
        compiled = self._inner(graph)(gm, example_inputs)
        graph.math_calls(sum(node.op == "call_function" and node.target is _SDPA for node in gm.graph.nodes))

        def run(*args):
            graph.executions += 1
            return compiled(*args)

        return run

    def _inner(self, graph: _Graph):
        """The mode's compiler with `graph` reading each ATen graph it is handed (forward, backward) first."""
        from torch._dynamo.backends.common import aot_autograd

        if self.mode.backend == "aot_eager":
            from torch._dynamo.backends.debugging import boxed_nop
            from torch._functorch.partitioners import min_cut_rematerialization_partition

            def forward(gm, inputs):
                graph.read(gm, backward=False)
                return boxed_nop(gm, inputs)

            def backward(gm, inputs):
                graph.read(gm, backward=True)
                return boxed_nop(gm, inputs)

            return aot_autograd(fw_compiler=forward, bw_compiler=backward,
                                partition_fn=min_cut_rematerialization_partition,
                                keep_inference_input_mutations=True)
        from torch._functorch import config as functorch_config
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner

        def inner(gm, inputs, **kwargs):
            graph.read(gm, backward=bool(kwargs.get("is_backward")))
            return compile_fx_inner(gm, inputs, **kwargs)  # Inductor's FX graph cache still serves its code

        def inductor(gm, inputs):
            # A hit of AOTAutograd's cache hands back compiled code without the graph: the proof would have none.
            with functorch_config.patch(enable_autograd_cache=False):
                return compile_fx(gm, inputs, inner_compile=inner)

        return inductor

    def __enter__(self) -> CompiledRun:
        self.measured_from = len(self.graphs)
        for graph in self.graphs:
            graph.executions = 0
        return self

    def __exit__(self, *exc) -> None:
        # Dynamo's counters are global: the breaks are this case's when its run ends (the next case clears them).
        self.break_reasons = {_first_line(reason): count
                              for reason, count in torch._dynamo.utils.counters["graph_break"].items()}
        self.calls.clear()
        for graph in self.graphs:
            for module, keys in graph.calls.items():
                self.calls[module] += len(keys) * graph.executions

    def executed(self) -> dict[str, int]:
        """The attention kernels of the measured run (as harness.rank.recorder writes them)."""
        return self._times("kernels")

    def dispatches(self) -> tuple[dict[str, int], dict[str, int]]:
        """diffusers' dispatches in the measured run's graphs, by backend name and by the function that ran."""
        return self._times("dispatched"), self._times("functions")

    def _times(self, what: str) -> dict[str, int]:
        total: Counter = Counter()
        for graph in self.graphs:
            for name, count in getattr(graph, what).items():
                total[name] += count * graph.executions
        return dict(sorted(total.items()))

    def recorded(self) -> dict[str, dict[str, list[int]]]:
        """module -> collective -> [count, bytes] of the measured run, as harness.rank.recorder writes them."""
        table: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
        for graph in self.graphs:
            for (module, collective), (count, size) in graph.collectives.items():
                entry = table[module][collective]
                entry[0] += count * graph.executions
                entry[1] += size * graph.executions
        return {module: dict(sorted(row.items())) for module, row in sorted(table.items())}

    def figures(self) -> dict:
        """What the compile made (after the measured run): graphs, graph breaks with Dynamo's reasons, recompiles
        in the measured run, and how often each graph ran in it."""
        reasons = self.break_reasons
        recompiles = len(self.graphs) - (self.measured_from if self.measured_from is not None else len(self.graphs))
        return {"mode": self.mode.name, "graphs": len(self.graphs), "graph_breaks": sum(reasons.values()),
                "break_reasons": reasons, "recompiles": recompiles,
                "executions": [graph.executions for graph in self.graphs], "notes": self.notes()}

    def notes(self) -> list[str]:
        """The parts of the proof a compiled run gives differently from an eager one, said with every case."""
        notes = [PROOF_NOTE, CROSS_ATTENTION_NOTE]
        if self.mode.backend == "inductor":
            notes.append(INDUCTOR_NOTE)
        return notes


def compile_like(mode_name: str, module: torch.nn.Module) -> None:
    """Compile `module` in place as a case of mode `mode_name` is, without recording (a single-device baseline)."""
    mode = mode_of(mode_name)
    if mode.backend is not None:
        torch._dynamo.reset()
        module.compile(backend=mode.backend)


class _Graph:
    """One Dynamo graph as its ATen graphs hold it: attention kernels, collectives per module, module calls."""

    def __init__(self, index: int):
        self.index, self.executions = index, 0
        self.kernels: Counter = Counter()
        self.dispatched: Counter = Counter()  # diffusers' backend dispatches traced into it (harness.rank.backends)
        self.functions: Counter = Counter()
        self.collectives: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        self.calls: dict[str, set] = defaultdict(set)

    def read(self, gm: torch.fx.GraphModule, backward: bool) -> None:
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            stack = node.meta.get("nn_module_stack") or {}
            if not backward:
                for key, (path, _) in stack.items():
                    self.calls[_module(path)].add(key)
            module = BACKWARD if backward else (_module(list(stack.values())[-1][0]) if stack else "")
            self._op(node, module, backward)

    def math_calls(self, sdpa_calls: int) -> None:
        """SDPA's math path is a composite that AOTAutograd decomposes into plain ops: a Dynamo-level SDPA call
        with no fused kernel beneath it in the ATen graph ran math (as harness.rank.recorder tells it in eager)."""
        fused = sum(count for name, count in self.kernels.items() if name in kernels.SDPA_KERNELS)
        if sdpa_calls > fused:
            self.kernels[kernels.MATH] += sdpa_calls - fused

    def _op(self, node, module: str, backward: bool) -> None:
        target = node.target
        if isinstance(target, torch._ops.HigherOrderOperator):
            name = kernels.kernel_of_operator(target.name())
            if name is not None and not backward:
                self.kernels[name] += 1
            return
        if not isinstance(target, torch._ops.OpOverload):
            return
        collective = comms.collective_of(target)
        if collective is not None:
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda arg: arg.meta.get("val"))
            entry = self.collectives[module, collective]
            entry[0] += 1
            entry[1] += comms.payload_bytes(target, args, kwargs)
        elif not backward and (name := kernels.kernel_of_operator(target._schema.name)) is not None:
            self.kernels[name] += 1


def _module(path: str) -> str:
    """The module's name in the compiled module, from how Dynamo wrote its source: `L['self'].blocks.0.attn`, or
    through diffusers' hooks (which wrap `forward`) `forward.__self__.__dict__['_modules']['blocks'].0.attn`."""
    path = _ITEM.sub(lambda match: "." + (match[1] or match[2]), path)
    while (shorter := _ROOT.sub("", path)) != path:
        path = shorter
    return path.strip(".")


def _first_line(reason: str) -> str:
    return reason.strip().splitlines()[0] if reason.strip() else reason
