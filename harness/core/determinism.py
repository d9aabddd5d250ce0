"""Numerics settings shared by capture and workers: fp32 references must be true fp32."""

from __future__ import annotations

import logging
import warnings

import torch


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
