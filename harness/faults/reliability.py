"""Reliability faults: a rank that hangs, raises, is killed or dies in native code, and on several nodes a hung rank
or a killed torchrun agent. Each must cost only its own case, reported as TIMEOUT or ERROR naming the rank
(tests/unit/test_reliability.py, tests/unit/test_multinode.py)."""

from __future__ import annotations

import contextlib

from harness.faults.registry import fault


@contextlib.contextmanager
def _on_rank1(action):
    """`action` on rank 1 once every rank is in the case: after a case's last collective rank 0 still judges it
    while the others begin the next, and a fault acting at once would hit while rank 0 is a case behind."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        if dist.get_rank() == 1:
            action()
    yield


@contextlib.contextmanager
def _on_node1(action, local_rank: int):
    """`action` on one rank of node 1 (its local rank `local_rank`, -1 for the last); a no-op on one host."""
    import os

    from harness.core.records import NODE_ENV

    local, count = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if os.environ.get(NODE_ENV) == "1" and local == local_rank % count:
        action()
    yield


def _sleep_forever():
    import time

    time.sleep(3600)


def _raise():
    raise RuntimeError("deliberate failure on rank 1 (raise_rank1)")


def _sigkill_self():
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def _abort_self():
    import os

    os.abort()  # SIGABRT, as glibc ends a process whose heap it finds corrupted


def _abort_self_once():
    """Abort the first time only in this run: the marker it leaves in the run's launches folder (the parent of the
    launch folder whose group file is the rank's last argument, forked or under torchrun) spares the rerun."""
    import sys
    from pathlib import Path

    marker = Path(sys.argv[-1]).resolve().parent.parent / "abort_rank1_once.done"
    if not marker.exists():
        marker.touch()
        _abort_self()


def _overflow_heap_block():
    """Write 8 bytes past the end of a 40-byte tensor's heap block, then free it. Without glibc's heap checks nothing
    notices at once (the damage to the next block surfaces later, or never); with them (malloc-check mode) the
    block's free aborts there and then: benchmarks/heap_stress.py's positive control."""
    import ctypes

    import torch

    block = torch.empty(10)  # 40 bytes from PyTorch's CPU allocator (posix_memalign)
    ctypes.memset(block.data_ptr() + 40, 0x41, 8)
    del block


def _sigkill_agent():
    """Kill this node's torchrun (which started this rank), then wait, as a node whose agent died does no more
    work: the case cannot finish before the node's harness agent has seen it."""
    import os
    import signal

    os.kill(os.getppid(), signal.SIGKILL)
    _sleep_forever()


@fault("reliability: rank 1 never reaches the collective the others wait in")
def hang_rank1():
    return _on_rank1(_sleep_forever)


@fault("reliability: rank 1 raises before the forward while the others wait in a collective")
def raise_rank1():
    return _on_rank1(_raise)


@fault("reliability: rank 1 is killed (SIGKILL) in the middle of the case")
def kill_rank1():
    return _on_rank1(_sigkill_self)


@fault("reliability: rank 1 dies in native code (abort) in the middle of the case")
def abort_rank1():
    return _on_rank1(_abort_self)


@fault("reliability: rank 1 dies in native code (abort) in the middle of the case's first attempt only: its "
       "rerun in a fresh group runs clean")
def abort_rank1_once():
    return _on_rank1(_abort_self_once)


@fault("reliability: rank 1 writes 8 bytes past the end of a heap block in the middle of the case (unnoticed there "
       "unless glibc's heap checks are on, as benchmarks/heap_stress.py runs the ranks: then it dies at the block's "
       "free)")
def heap_overflow_rank1():
    return _on_rank1(_overflow_heap_block)


@fault("reliability, several nodes: the last rank of node 1 never reaches the collective (none elsewhere)")
def hang_node1():
    return _on_node1(_sleep_forever, -1)


@fault("reliability, several nodes: node 1's torchrun agent is killed (SIGKILL) in the middle of the case, and its "
       "ranks stop (none elsewhere)")
def kill_agent_node1():
    return _on_node1(_sigkill_agent, 0)
