"""What diffusers treats as attention: `enable_parallelism` hands these modules' processors the CP config."""

from __future__ import annotations


def attention_classes() -> tuple[type, ...]:
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention, MochiAttention

    return Attention, MochiAttention, AttentionModuleMixin
