"""The proof's recording, made during the case's own timed run: which attention kernels executed and which
collectives each module performed.

Two light Python modes see everything the proof needs, at a few milliseconds a case on the tiny zoo, where
torch.profiler cost a second run and 10 to 20 times a forward in event processing (docs/measured.md):
- a dispatch mode sees every op that reaches PyTorch's dispatcher: the fused SDPA kernels, flex attention's
  higher-order op, package kernels registered as custom ops (flash-attn, xformers), and every collective, whoever
  issues it (harness.rank.comms names them);
- a function mode sees each `scaled_dot_product_attention` call. SDPA's math path is a composite of plain ops that
  never reaches the dispatcher as one op: a call for which SDPA's own selection (`torch._fused_sdp_choice`, the
  function SDPA asks) answers math is the math kernel, and runs with the dispatch mode aside, because the math path
  changes its ops under an active dispatch mode.
Module hooks attribute a collective to the innermost module whose forward is running (a hook that runs after the
module's own hooks closes it, so a row-wise layer's all-reduce is its own); one in a backward pass goes to
`BACKWARD`. Kernels count only inside `scope`'s forward when a scope is given (a pipeline's VAE may call SDPA itself).
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter, defaultdict

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _python_dispatch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.rank import comms, kernels

OUTSIDE, BACKWARD = "(outside the model)", "(backward)"
SDPA = torch.nn.functional.scaled_dot_product_attention  # the builtin, whatever a fault puts in its place later


class _Dispatched(TorchDispatchMode):
    supports_higher_order_operators = True  # flex attention is a higher-order op: counted, then run

    def __init__(self, recorder: RunRecorder):
        super().__init__()
        self.recorder = recorder

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Step aside while torch.compile traces (flex attention compiles its kernel wrapper, and Dynamo refuses to
        trace under a user dispatch mode); a collective inside a compiled graph is then not seen op by op."""
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            self.recorder.kernel(kernels.kernel_of_operator(func.name()))
            return func(*args, **kwargs)
        if any(t is not torch.Tensor and is_dtensor(t) for t in types):
            return NotImplemented  # DTensor desugars into plain ops (its collectives among them) that come back here
        collective = comms.collective_of(func)
        if collective is not None:
            self.recorder.collective(collective, comms.payload_bytes(func, args, kwargs))
        else:
            self.recorder.kernel(kernels.kernel_of_operator(func._schema.name))
        return func(*args, **kwargs)


class _Called(TorchFunctionMode):
    def __init__(self, recorder: RunRecorder):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not SDPA:
            return func(*args, **kwargs)
        if _sdpa_choice(args, kwargs) == MATH_CHOICE:
            # SDPA's math path sees an active dispatch mode and swaps its in-place ops for functional ones, which
            # broadcast where the in-place ones refuse (an LTX mask under Ulysses 4 then fails later, elsewhere):
            # the dispatch mode steps aside, so this call runs as it does for a user.
            with _without(self.recorder.dispatched):
                output = func(*args, **kwargs)
            self.recorder.kernel(kernels.MATH)
            return output
        fused = self.recorder.fused
        output = func(*args, **kwargs)
        if self.recorder.fused == fused:  # no fused kernel beneath this call after all: SDPA took its math path
            self.recorder.kernel(kernels.MATH)
        return output


MATH_CHOICE = int(torch.nn.attention.SDPBackend.MATH)  # what torch._fused_sdp_choice answers for the math path


def _sdpa_choice(args: tuple, kwargs: dict) -> int | None:
    """The kernel SDPA will pick for this call, asked the way SDPA asks: on the inputs autocast would hand it (SDPA
    runs in autocast's lower precision). None when the selection refuses (SDPA itself then raises, or serves the
    call some other way: what the dispatch mode sees decides)."""
    query = args[0] if args else kwargs.get("query")
    device = query.device.type if isinstance(query, torch.Tensor) else "cpu"
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        args = tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        kwargs = {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                  for k, v in kwargs.items()}
    try:
        return torch._fused_sdp_choice(*args, **kwargs)
    except RuntimeError:
        return None


@contextlib.contextmanager
def _without(mode: TorchDispatchMode):
    """`mode` off while the block runs, when it is the innermost dispatch mode (it always is in a case's run)."""
    if _python_dispatch._get_current_dispatch_mode() is not mode:
        yield
        return
    with _python_dispatch._pop_mode_temporarily():
        yield


@functools.cache
def is_dtensor(cls) -> bool:
    from torch.distributed.tensor import DTensor

    return issubclass(cls, DTensor)


class RunRecorder:
    """`with RunRecorder(model, scope) as recorder: run()`; then `recorder.kernels` (attention kernel -> executions),
    `recorder.table` (module -> collective -> [count, bytes]), `recorder.calls` (module -> forward calls that
    computed: not those a cache answered) and `recorder.context_calls` (those given a `comms.CONTEXT` tensor): what a
    communication prediction is scaled by."""

    def __init__(self, root: torch.nn.Module, scope: torch.nn.Module | None = None):
        self.root, self.scope = root, scope
        self.kernels: Counter = Counter()
        self.fused = 0  # fused kernels seen so far, inside the scope or not (what tells a math SDPA call apart)
        self.table: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
        self.calls: dict[str, int] = defaultdict(int)
        self.context_calls: dict[str, int] = defaultdict(int)
        self._stack: list[str] = []
        self._computed: list[list] = []  # per module call in progress: [whether a submodule ran, its context call]
        self._inside_scope = 0
        self._handles: list = []
        self.dispatched = _Dispatched(self)
        self._modes = (self.dispatched, _Called(self))

    def kernel(self, name: str | None) -> None:
        if name is None:
            return
        self.fused += name != kernels.MATH
        if self.scope is None or self._inside_scope:
            self.kernels[name] += 1

    def collective(self, collective: str, size: int) -> None:
        backward = torch._C._current_graph_task_id() != -1
        module = BACKWARD if backward else (self._stack[-1] if self._stack else OUTSIDE)
        entry = self.table[module][collective]
        entry[0] += 1
        entry[1] += size

    def __enter__(self) -> RunRecorder:
        if self.scope is not None and all(module is not self.scope for module in self.root.modules()):
            raise ValueError("the recorder's scope must be its root or one of the root's submodules")
        for name, module in self.root.named_modules():
            self._handles += [module.register_forward_pre_hook(self._enter(name, module), prepend=True,
                                                               with_kwargs=True),
                              module.register_forward_hook(self._leave(name, module), always_call=True)]
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _enter(self, name: str, module: torch.nn.Module):
        position = comms.context_position(type(module))
        is_scope = module is self.scope

        def hook(_, args, kwargs):
            self.calls[name] += 1
            self._stack.append(name)
            self._inside_scope += is_scope
            context = False
            if position is not None:
                context = isinstance(kwargs.get(comms.CONTEXT, args[position] if position < len(args) else None),
                                     torch.Tensor)
                self.context_calls[name] += context
            if self._computed:
                self._computed[-1][0] = True
            self._computed.append([False, context])

        return hook

    def _leave(self, name: str, module: torch.nn.Module):
        """A call of a module with submodules that ran none of them returned what a cache kept (diffusers' caches
        hook the module's forward): it computed nothing and communicated nothing, so it is not counted."""
        is_scope, has_children = module is self.scope, next(module.children(), None) is not None

        def hook(*_):
            if self._stack:
                self._stack.pop()
            self._inside_scope -= is_scope
            if self._computed:
                ran, context = self._computed.pop()
                if has_children and not ran:
                    self.calls[name] -= 1
                    self.context_calls[name] -= context

        return hook

    def recorded(self) -> dict[str, dict[str, list[int]]]:
        """The collectives as plain sorted dicts (what a CaseRecord carries)."""
        return {module: dict(sorted(row.items())) for module, row in sorted(self.table.items())}

    def executed(self) -> dict[str, int]:
        """The attention kernels as a plain sorted dict (what a CaseRecord carries)."""
        return dict(sorted(self.kernels.items()))
