"""The faults' registry is their one source: every fault is found by its name through `@fault` on its own code, with
its description; the plan's check, the `--inject-fault` help and the selftest's tables read it; listing the faults
imports no torch."""

import subprocess
import sys
from pathlib import Path

import pytest

from harness import faults
from harness.core.errors import HarnessError

FAMILIES = {path.stem for path in (Path(faults.__file__).parent).glob("*.py")} - {"__init__", "registry", "patching"}


def test_listing_the_faults_imports_no_torch():
    """`harness --help` and a plan's check list the faults: that must cost no torch or diffusers import."""
    code = ("import sys; from harness import faults; names = faults.usages(); faults.check(names[0]); "
            "print(len(names), sorted(m for m in ('torch', 'diffusers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(maxsplit=1) == [str(len(faults.REGISTERED)), "[]\n"]


def test_every_fault_is_registered_with_its_description_by_its_family():
    assert len(faults.REGISTERED) >= 30
    for name, found in faults.REGISTERED.items():
        assert found.name == name == found.start.__name__
        assert found.description.strip() and found.description == found.description.strip(), name
        assert found.family in FAMILIES, name
    assert {found.family for found in faults.REGISTERED.values()} == FAMILIES  # no family module without a fault
    assert [name for name, found in faults.REGISTERED.items() if found.model_change] == ["rope_sign", "shared_scale",
                                                                                          "shared_grad"]
    assert {found.family for found in faults.REGISTERED.values() if found.targeted} == {"targeted"}


def test_a_name_registered_twice_is_refused():
    def cp_local_attention():
        """The name of an existing fault."""

    before = dict(faults.REGISTERED)
    with pytest.raises(ValueError, match="'cp_local_attention' is registered twice: in harness.faults.cp and in"):
        faults.fault("again")(cp_local_attention)
    assert faults.REGISTERED == before


@pytest.mark.parametrize("name", ["no_such_fault", "scale_output", "scale_output:", "cp_local_attention:x.y"])
def test_check_refuses_what_is_not_a_fault_and_lists_the_valid_ones(name):
    with pytest.raises(HarnessError) as refused:
        faults.check(name)
    message = str(refused.value)
    assert message.startswith(f"unknown fault {name!r}; valid faults: ")
    assert all(usage in message for usage in faults.usages())


def test_check_takes_each_fault_as_inject_fault_does():
    for usage in faults.usages():
        faults.check(usage.replace(faults.registry.MODULE_PATH, "transformer_blocks.0.attn"))
    assert "scale_output:<module path>" in faults.usages() and "cp_local_attention" in faults.usages()
    assert faults.is_model_change("rope_sign") and not faults.is_model_change("cp_local_attention")
    assert faults.is_model_change("shared_scale:x_embedder") and not faults.is_model_change("scale_output:x_embedder")
    assert not faults.is_model_change("scale_output:x_embedder") and not faults.is_model_change(None)


def test_the_inject_fault_help_names_each_fault(capsys):
    from harness.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--inject-fault FAULT" in help_text
    assert [usage for usage in faults.usages() if usage not in help_text] == []


def test_active_runs_the_registered_code_and_undoes_it():
    import torch

    sdpa = torch.nn.functional.scaled_dot_product_attention
    with faults.active(None):
        assert torch.nn.functional.scaled_dot_product_attention is sdpa
    with faults.active("scaled_softmax"):
        assert torch.nn.functional.scaled_dot_product_attention is not sdpa
    assert torch.nn.functional.scaled_dot_product_attention is sdpa
    with pytest.raises(HarnessError, match="unknown fault 'scaled_softmaxx'"):
        with faults.active("scaled_softmaxx"):
            pass


def test_the_selftest_tables_name_registered_faults():
    """Each row of the selftest's tables checks its fault as the table is read: a misspelt one never reaches a run."""
    from harness.run.selftest import LOCALIZE_CONTROLS, Broken, Control

    for broken in LOCALIZE_CONTROLS:  # registered; targeted unless the row says what the bug is instead of a module
        assert faults.find(broken.fault)[0].targeted or broken.says, broken
    with pytest.raises(HarnessError, match="unknown fault 'cp_local_atention'"):
        Control("flux", "ulysses2", "native", "fp32", "cp_local_atention", "> tolerance")
    with pytest.raises(ValueError, match="needs a targeted fault"):
        Broken("flux", "ulysses2", "native", "cp_local_attention")


class _Base:
    @staticmethod
    def kept():
        return "base"


class _Child(_Base):
    pass


def test_patched_swaps_for_the_block_and_restores_whatever_ends_it():
    from harness.faults.patching import patched

    held = _Base.__dict__["kept"]
    with pytest.raises(RuntimeError, match="inside"):
        with patched(_Base, "kept", staticmethod(lambda: "patched")):
            assert _Base.kept() == _Child.kept() == "patched"
            raise RuntimeError("inside")
    assert _Base.__dict__["kept"] is held  # the staticmethod object itself, not the function it wraps


def test_patched_removes_what_the_holder_only_inherited():
    from harness.faults.patching import patched

    with patched(_Child, "kept", staticmethod(lambda: "child")):
        assert _Child.kept() == "child" and _Base.kept() == "base"
    assert "kept" not in vars(_Child) and _Child.kept() == "base"


def _patchable_state() -> dict:
    """What the faults patch (each holder's own attributes, and diffusers' backend table), as it stands now."""
    import importlib

    from diffusers import ModelMixin
    from diffusers.hooks.context_parallel import EquipartitionSharder, ModuleForwardMetadata
    from diffusers.hooks.first_block_cache import FBCHeadBlockHook
    from diffusers.hooks.taylorseer_cache import TaylorSeerCacheHook
    from diffusers.loaders.peft import PeftAdapterMixin
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry
    from torch.distributed.tensor.experimental._context_parallel import _attention as ring
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from harness.rank import training

    modules = ["diffusers.models.attention_dispatch", "diffusers.models.transformers.transformer_flux",
               "diffusers.hooks.tensor_parallel", "torch.nn.functional", "harness.rank.torch_cp", "harness.flows.calls"]
    holders = [*map(importlib.import_module, modules), training, training.Batch, ModelMixin, EquipartitionSharder,
               ModuleForwardMetadata, ColwiseParallel, RowwiseParallel, ring._AllGatherRotater, PeftAdapterMixin,
               AttentionModuleMixin, FBCHeadBlockHook, TaylorSeerCacheHook]
    return {"backends": dict(_AttentionBackendRegistry._backends),
            **{(id(holder), name): value for holder in holders for name, value in list(vars(holder).items())}}


def test_every_fault_patches_only_while_active():
    """Each fault (but the reliability ones, which act on a rank of a live group) changes what it patches inside its
    block and leaves everything as it found it after."""
    before = _patchable_state()
    for usage in faults.usages():
        with faults.active(usage.replace(faults.registry.MODULE_PATH, "transformer_blocks.0.attn")):
            during = _patchable_state()
        assert (during != before) == (faults.find(usage)[0].family != "reliability"), usage
        assert _patchable_state() == before, usage
