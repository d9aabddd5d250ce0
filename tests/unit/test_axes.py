"""A case id is spelled and parsed in one place (harness.core.axes): `parse` is `spell`'s exact inverse over real ids
of a plan, every reader of ids goes through it, and a malformed id is a ValueError that names it."""

import re
from itertools import product

import pytest

from harness.core import axes
from harness.core.modes import eager_id
from harness.core.records import without_fault

LAYOUTS = ["single", "ulysses2", "ring2xulysses2", "ulysses2any", "tp2", "tp2+ulysses2", "tp2+ring2", "dp2xtcp2"]


@pytest.fixture(scope="module")
def plan():
    """Real planned cases: shapes, both kinds, compiled modes, layouts whose name holds the fault's `+`, a fault and
    a targeted fault."""
    from harness.run.plan import build_plan

    return [planned.case for fault in (None, "cp_local_attention", "scale_output:transformer_blocks.0.attn")
            for planned in build_plan(["flux", "qwenimage"], LAYOUTS, ["native"], ["fp32", "bf16"], shapes=["all"],
                                      kinds=("tensor", "train"), fault=fault,
                                      more={"mode": ["eager", "aot_eager", "compile"]})]


def test_parse_is_the_inverse_of_spell_over_a_plan(plan):
    assert {case.shape for case in plan} >= {"default", "masked"}
    assert {case.mode for case in plan} >= {"eager", "aot_eager"}
    assert any("+" in case.layout.name and case.fault for case in plan)
    for case in plan:
        parsed = axes.parse(case.case_id)
        assert parsed == {**case.axis_values(), "fault": case.fault}, case.case_id
        assert axes.spell(parsed, parsed["fault"]) == case.case_id


def test_parse_reads_each_axis_at_its_default_and_off_it():
    """Every combination of the axes that an id leaves out at their default, each on and off it: an axis added
    later whose part `parse` cannot place fails here."""
    defaulted = [axis for axis in axes.AXES if axis.default is not None]
    for chosen in product((True, False), repeat=len(defaulted)):
        values = {axis.name: next((name for name in axis.known() if name != axis.default), f"{axis.name}1")
                  for axis in axes.AXES}
        values |= {axis.name: axis.default for axis, off in zip(defaulted, chosen, strict=True) if not off}
        for fault in (None, "cp_local_attention"):
            case_id = axes.spell(values, fault)
            assert axes.parse(case_id) == {**values, "fault": fault}, case_id


@pytest.mark.parametrize("case_id, said", [
    ("flux/ulysses2/native/fp32", "4 `/`-separated part(s), not 5 to 8"),
    ("flux/ulysses2/native/fp32/tensor/pretrained/lora/compile/x", "9 `/`-separated part(s)"),
    ("flux/ulysses2/native/fp32/tensor/compile/x", "'x' is none of the values of load, flow, mode"),
    ("flux/ulysses2/native/fp32/tensor/compile/pretrained",
     "'pretrained' is none of the values of load, flow, mode (or not in their order)"),
    ("", "1 `/`-separated part(s)"),
    ("flux//native/fp32/tensor", "no layout"),
    ("flux@/ulysses2/native/fp32/tensor", "no shape"),
    ("flux/ulysses2/native/fp32/tensor+", "no fault"),
    ("flux@default/ulysses2/native/fp32/tensor", "a default written out"),
    ("flux/ulysses2/native/fp32/tensor/eager", "a default written out"),
])
def test_a_malformed_id_is_a_value_error_that_names_it(case_id, said):
    with pytest.raises(ValueError, match=re.escape(f"case id {case_id!r} is not of the form {axes.FORM}: {said}")):
        axes.parse(case_id)
    assert axes.FORM == "model[@shape]/layout/backend/dtype/kind[/load][/flow][/mode][+fault]"


def test_the_readers_of_ids_parse_them():
    """The eager twin and a fault's case, of a layout whose name holds a `+` too (a hand split on `+` took the layout's
    second half for a fault)."""
    assert eager_id("flux/tp2+ulysses2/native/fp32/tensor/compile") == ("flux/tp2+ulysses2/native/fp32/tensor",
                                                                        "compile")
    assert eager_id("wan@masked/tp2+ring2/native/bf16/train/aot_eager+grad_scale:blocks.0") == \
        ("wan@masked/tp2+ring2/native/bf16/train+grad_scale:blocks.0", "aot_eager")
    assert eager_id("flux/tp2+ulysses2/native/fp32/tensor") == ("flux/tp2+ulysses2/native/fp32/tensor", "eager")
    assert without_fault("flux/tp2+ulysses2/native/fp32/tensor/compile+rope_sign") == \
        "flux/tp2+ulysses2/native/fp32/tensor/compile"
    assert axes.file_stem("wan@masked/ulysses2/native/fp32/tensor") == "wan-masked-ulysses2-native-fp32-tensor"


def test_a_case_id_on_the_command_line_gives_its_plan_options():
    from harness.core.errors import HarnessError
    from harness.versions.cases import plan_options

    assert plan_options(["qwenimage@masked/tp2+ulysses2/native/bf16/train/aot_eager", "flux/single/native/fp32/tensor"]
                        ) == {"models": "qwenimage,flux", "shapes": "masked,default", "layouts": "tp2+ulysses2,single",
                              "backends": "native", "dtypes": "bf16,fp32", "kinds": "train,tensor",
                              "loads": "enable", "flows": "none", "modes": "aot_eager,eager", "load_cases": "*",
                              "flow_cases": "*"}
    with pytest.raises(HarnessError, match=r"'flux/ulysses2' is not of the form .*, e.g. qwenimage@masked/"):
        plan_options(["flux/ulysses2"])
    with pytest.raises(HarnessError, match=r"\+cp_local_attention is a deliberate bug"):
        plan_options(["flux/ulysses2/native/fp32/tensor+cp_local_attention"])
