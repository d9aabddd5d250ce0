"""Short dtype names used in case ids and options."""

from __future__ import annotations

import torch

from harness.core.errors import HarnessError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise HarnessError(f"unknown dtype {name!r}; valid dtypes: {', '.join(DTYPES)}") from None
