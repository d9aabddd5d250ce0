"""`patched`: the one way a fault swaps an attribute of diffusers, PyTorch or the harness for the length of a block.
Torch-free, like the registry, so that importing the faults stays cheap."""

from __future__ import annotations

import contextlib

_ABSENT = object()  # the holder did not hold the attribute itself (it was inherited): removed again afterwards


@contextlib.contextmanager
def patched(holder, attr: str, value):
    """`holder.attr` is `value` inside the block and what it was after it, however the block ends. The old value is
    read from the holder's own `__dict__`, so a class's staticmethod or classmethod comes back as that object, and an
    inherited attribute is removed rather than pinned onto the holder."""
    saved = vars(holder).get(attr, _ABSENT)
    setattr(holder, attr, value)
    try:
        yield
    finally:
        if saved is _ABSENT:
            delattr(holder, attr)
        else:
            setattr(holder, attr, saved)
