"""The proof's recording of attention kernels (harness.rank.recorder) on real SDPA calls: each call named by the
kernel that ran beneath it, the math path included, only inside the scope, forward kernels only. Its collectives are
tested in test_comms.py; the deliberate bugs it catches in real launches in test_negative_controls.py."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness.rank.kernels import FLASH_CPU, MATH, kernel_mismatch
from harness.rank.recorder import RunRecorder


class Attention(torch.nn.Module):
    def __init__(self, backend=None):
        super().__init__()
        self.backend = backend

    def forward(self, x):
        if self.backend is None:
            return torch.nn.functional.scaled_dot_product_attention(x, x, x)
        with sdpa_kernel(self.backend):
            return torch.nn.functional.scaled_dot_product_attention(x, x, x)


class Pipeline(torch.nn.Module):
    """A transformer and a decoder that both call SDPA, like a pipeline's VAE."""

    def __init__(self):
        super().__init__()
        self.transformer, self.decoder = Attention(SDPBackend.MATH), Attention(SDPBackend.FLASH_ATTENTION)

    def forward(self, x):
        return self.decoder(self.transformer(x))


def _kernels(module, x, scope=None, backward=False):
    with RunRecorder(module, scope) as recorder:
        out = module(x)
        if backward:
            out.sum().backward()
    return recorder.executed()


def test_each_call_is_named_by_the_kernel_beneath_it():
    x = torch.randn(1, 2, 8, 4)
    assert _kernels(Attention(SDPBackend.MATH), x) == {MATH: 1}  # no fused kernel dispatched: the math path
    assert _kernels(Attention(SDPBackend.FLASH_ATTENTION), x) == {FLASH_CPU: 1}
    assert _kernels(Pipeline(), x) == {MATH: 1, FLASH_CPU: 1}
    assert _kernels(torch.nn.Linear(4, 4), x) == {}  # no attention at all


def test_a_fused_kernel_called_under_the_math_backend_is_caught():
    """The field's bug: the math backend selected, a flash kernel executing beneath it."""

    class FlashBeneathMath(torch.nn.Module):
        def forward(self, x):
            with sdpa_kernel(SDPBackend.MATH):
                return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(x, x, x)[0]

    executed = _kernels(FlashBeneathMath(), torch.randn(1, 2, 8, 4))
    assert executed == {FLASH_CPU: 1}
    assert "flash_attention_for_cpu" in kernel_mismatch("_native_math", executed)
    assert kernel_mismatch("_native_math", _kernels(Attention(SDPBackend.MATH), torch.randn(1, 2, 8, 4))) is None


def test_only_the_scope_counts_and_backward_kernels_do_not():
    pipe, x = Pipeline(), torch.randn(1, 2, 8, 4, requires_grad=True)
    assert _kernels(pipe, x, scope=pipe.transformer) == {MATH: 1}
    assert _kernels(pipe, x, scope=pipe.decoder) == {FLASH_CPU: 1}
    assert _kernels(Attention(), x, backward=True) == {FLASH_CPU: 1}  # its backward kernel ran too, not counted


def test_hooks_and_modes_are_gone_afterwards():
    pipe, x = Pipeline(), torch.randn(1, 2, 8, 4)
    with RunRecorder(pipe, pipe.transformer) as recorder:
        pipe(x)
    assert not pipe.transformer._forward_pre_hooks and not pipe.transformer._forward_hooks
    pipe(x)
    assert recorder.executed() == {MATH: 1} and recorder.calls["transformer"] == 1  # nothing after the exit


def test_the_math_path_runs_as_it_does_unrecorded():
    """SDPA's math path takes functional ops under an active dispatch mode, and those broadcast a mask its in-place
    ops refuse: recorded, the call must fail exactly as it does for a user (an LTX mask under Ulysses 4 did not)."""
    mask = torch.randn(2, 1, 8, 8)  # broadcasts to more batches than the attention has

    class Masked(torch.nn.Module):
        def forward(self, x):
            with sdpa_kernel(SDPBackend.MATH):
                return torch.nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=mask)

    x = torch.randn(1, 2, 8, 4)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape") as unrecorded:
        Masked()(x)
    with pytest.raises(RuntimeError) as recorded, RunRecorder(Masked()) as recorder:
        recorder.root(x)
    assert str(recorded.value) == str(unrecorded.value)


def test_a_call_under_autocast_is_asked_about_as_sdpa_sees_it():
    """Autocast hands SDPA its inputs in one lower precision; asked about the raw mixed-dtype inputs, the selection
    refuses every kernel (a bf16 training case ERRORed so): the recorder asks about what SDPA sees."""

    class Mixed(torch.nn.Module):
        def forward(self, x):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.autocast("cpu", dtype=torch.bfloat16):
                return torch.nn.functional.scaled_dot_product_attention(x, x.bfloat16(), x)

    x = torch.randn(1, 2, 8, 4)
    assert _kernels(Mixed(), x) == {FLASH_CPU: 1}
    assert torch.equal(Mixed()(x), _recorded_output(Mixed(), x))


def _recorded_output(module, x):
    with RunRecorder(module):
        return module(x)
