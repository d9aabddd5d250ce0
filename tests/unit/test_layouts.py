import pytest

from harness.core.errors import HarnessError
from harness.core.layouts import DEFAULT_LAYOUTS, parse_layout


@pytest.mark.parametrize(
    ("name", "ring", "ulysses", "tp", "world_size", "anything"),
    [
        ("single", 1, 1, 1, 1, False),
        ("ulysses2", 1, 2, 1, 2, False),
        ("ring4", 4, 1, 1, 4, False),
        ("ring2xulysses2", 2, 2, 1, 4, False),
        ("tp2", 1, 1, 2, 2, False),
        ("ulysses2any", 1, 2, 1, 2, True),
        ("ring2any", 2, 1, 1, 2, True),
        ("ring2xulysses2any", 2, 2, 1, 4, True),
        ("ring2alltoall", 2, 1, 1, 2, False),
    ],
)
def test_parse_layout(name, ring, ulysses, tp, world_size, anything):
    layout = parse_layout(name)
    assert (layout.ring, layout.ulysses, layout.tp, layout.world_size, layout.anything) == (
        ring, ulysses, tp, world_size, anything)


@pytest.mark.parametrize("name", ["ulysses", "ulysses1", "ring", "tp1", "dp1", "dp2+tp2", "ring2xtp2", "Ulysses2"])
def test_bad_layout_names_list_valid_forms(name):
    with pytest.raises(HarnessError, match="valid forms|at least 2"):
        parse_layout(name)


def test_default_layouts_parse():
    assert [parse_layout(name).world_size for name in DEFAULT_LAYOUTS] == [1, 2, 2, 4, 4, 4, 2, 2, 2, 4]


def test_diffusers_configs():
    from diffusers import ContextParallelConfig, TensorParallelConfig

    config = parse_layout("ring2xulysses2").diffusers_config()
    assert isinstance(config, ContextParallelConfig)
    assert (config.ring_degree, config.ulysses_degree) == (2, 2)
    assert parse_layout("ulysses2any").diffusers_config().ulysses_anything
    assert isinstance(parse_layout("tp4").diffusers_config(), TensorParallelConfig)
    assert parse_layout("single").diffusers_config() is None
    assert parse_layout("ring2").mesh_spec() == ((2, 1), ("ring", "ulysses"))
    # the degrees a user writes, diffusers filling in the other
    assert (config.ring_degree, config.ulysses_degree) == (2, 2)
    assert parse_layout("ulysses2").diffusers_config().ring_degree == 1


@pytest.mark.parametrize(("name", "refusal"), [
    ("ring2alltoall", "Only rotate_method='allgather' is supported"),
    ("ring2xulysses2any", "ulysses_anything cannot be enabled when ring_degree > 1"),
])
def test_layouts_whose_config_diffusers_refuses_are_expected_refusals(name, refusal):
    """The plan asks the installed diffusers' validation: a refused config runs (--check-refusals) expecting
    diffusers' own message, or is a SKIP saying it; an accepted one is no refusal."""
    from harness.catalogue.predictions import config_refusal
    from harness.core.records import Case
    from harness.run.plan import expected_refusal

    expected = expected_refusal(Case("flux", parse_layout(name), "_native_flash", "fp32"))
    assert expected is not None and expected.seen_in(refusal) is False and refusal in expected.reason
    assert expected.seen_in(f"ValueError: {refusal}.") or expected.seen_in(
        f"NotImplementedError: {refusal} for now, but got alltoall.")
    assert config_refusal(parse_layout("ring2any")) is None and config_refusal(parse_layout("tp2+ulysses2")) is None


@pytest.mark.parametrize(
    ("name", "torch_cp", "dp", "rotate", "load_balance", "mesh"),
    [
        ("tcp2", 2, 1, "allgather", False, ((2,), ("cp",))),
        ("tcp4alltoall", 4, 1, "alltoall", False, ((4,), ("cp",))),
        ("tcp2lb", 2, 1, "allgather", True, ((2,), ("cp",))),
        ("dp2xtcp2", 2, 2, "allgather", False, ((2, 2), ("dp", "cp"))),
    ],
)
def test_pytorchs_context_parallel_layouts(name, torch_cp, dp, rotate, load_balance, mesh):
    """PyTorch's own CP: its own degree and mesh (torchtitan's `dp, cp`), no diffusers config."""
    layout = parse_layout(name)
    assert (layout.torch_cp, layout.dp, layout.rotate, layout.load_balance) == (torch_cp, dp, rotate, load_balance)
    assert layout.world_size == torch_cp * dp and layout.mesh_spec() == mesh
    assert layout.is_torch_context_parallel and not layout.is_context_parallel
    assert layout.diffusers_config() is None


@pytest.mark.parametrize("name", ["tcp1", "tcp", "tcp2xulysses2", "tp2+tcp2", "tcp2lballtoall"])
def test_bad_torch_cp_layout_names(name):
    with pytest.raises(HarnessError, match="valid forms|at least 2"):
        parse_layout(name)
