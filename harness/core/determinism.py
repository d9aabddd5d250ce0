"""Numerics settings shared by capture and workers: fp32 references must be true fp32."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from harness.core.records import RANK_THREADS


def rank_threads() -> int:
    """The CPU threads a rank computes with (harness.run.launchers.node_env sets them)."""
    return int(os.environ.get("OMP_NUM_THREADS", RANK_THREADS))


@contextmanager
def as_a_rank_computes() -> Iterator[None]:
    """A capture on the CPU threads a rank uses, so that one device in a rank reruns a reference bit for bit."""
    before = torch.get_num_threads()
    torch.set_num_threads(rank_threads())
    try:
        yield
    finally:
        torch.set_num_threads(before)


def strict_fp32() -> None:
    """TF32 off (it silently rounds fp32 matmuls to 10 mantissa bits on Ampere and later)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def quiet_diffusers() -> None:
    """diffusers' "experimental feature" warnings repeat per case and carry no information for a harness user. This
    process only: the environment its children get stays as it was (a rank's says so itself,
    harness.run.launchers.node_env), so a `harness` command a test starts is started as a user's would be."""
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()
    logging.getLogger("torch.distributed").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*flex_attention.*")
    warnings.filterwarnings("ignore", message=".*experimental.*", category=UserWarning)
