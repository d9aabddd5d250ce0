"""Option precedence, highest first: command line > [tool.harness] > --plan preset > default (docs/commands.md)."""

import pytest

from harness.core.errors import HarnessError
from harness.core.layouts import DEFAULT_LAYOUTS, FULL_LAYOUTS
from harness.kinds import kind_of
from harness.run.settings import OPTIONS, load_settings, preset

FULL, QUICK = list(FULL_LAYOUTS), list(DEFAULT_LAYOUTS)
QUICK_TRAIN = ["ulysses2", "ring2", "ring4", "ring2xulysses2", "tp2", "dp2", "dp2xulysses2", "tcp2"]


@pytest.mark.parametrize(
    ("key", "pyproject", "command_line", "expected"),
    [
        # a key no preset sets: command line > pyproject > default
        ("case_timeout", "", {}, OPTIONS["case_timeout"].default),
        ("case_timeout", "case_timeout = 7", {}, 7),
        ("case_timeout", "case_timeout = 7", {"case_timeout": 3.0}, 3.0),
        ("case_timeout", "", {"case_timeout": 3.0}, 3.0),
        # a key the quick plan (the default plan) sets: its preset fills it, pyproject and the command line win
        ("modes", "", {}, ["eager", "compile"]),
        ("modes", 'modes = ["eager"]', {}, ["eager"]),
        ("modes", 'modes = ["eager"]', {"modes": "regional"}, ["regional"]),
        ("modes", "", {"modes": "regional"}, ["regional"]),
        # a key only --plan full sets: the preset of the plan given, wherever the plan is given
        ("layouts", "", {}, QUICK),
        ("layouts", "", {"plan": "full"}, FULL),
        ("layouts", 'plan = "full"', {}, FULL),
        ("layouts", 'plan = "full"', {"plan": "quick"}, QUICK),
        ("layouts", 'layouts = ["tp2"]', {"plan": "full"}, ["tp2"]),
        ("layouts", 'layouts = ["tp2"]', {"plan": "full", "layouts": "ring2"}, ["ring2"]),
        # a kind's own key that a preset sets; a layout list written anywhere is the kind's too (None: it follows)
        ("train_layouts", "", {}, QUICK_TRAIN),
        ("train_layouts", "[tool.harness.train]\nlayouts = [\"dp2\"]", {}, ["dp2"]),
        ("train_layouts", "[tool.harness.train]\nlayouts = [\"dp2\"]", {"train_layouts": "ring2"}, ["ring2"]),
        ("train_layouts", 'layouts = ["tp2"]', {}, None),
        ("train_layouts", "", {"layouts": "tp2"}, None),
        # a kind's own key that no preset sets
        ("train_steps", "", {}, 3),
        ("train_steps", "[tool.harness.train]\nsteps = 5", {}, 5),
        ("train_steps", "[tool.harness.train]\nsteps = 5", {"train_steps": 2}, 2),
    ],
)
def test_precedence(project, key, pyproject, command_line, expected):
    (project / "pyproject.toml").write_text("[tool.harness]\n" + pyproject + "\n")
    assert load_settings(command_line).option(key) == expected


def test_a_kind_follows_the_layouts_given_where_its_own_are_not(project):
    """What the rows of `None` above mean: the train kind runs the layouts of --layouts."""
    settings = load_settings({"layouts": "tp2,ulysses2"})
    assert settings.kind_scope("train")[1] == ["tp2", "ulysses2"]
    assert load_settings({}).kind_scope("train")[1] != ["tp2", "ulysses2"]  # the control: the preset's own


def test_a_plan_takes_each_kinds_own_preset_and_compile_slice(project, monkeypatch):
    """What a plan sets of a kind's options, and which of its cases it compiles, the kind declares: the settings join
    them without naming a kind."""
    train = kind_of("train")
    monkeypatch.setattr(train, "presets", {"full": {"steps": 7}})
    monkeypatch.setattr(train, "compile_slice", lambda plan: ["flux/dp2/native/fp32/train"] if plan == "full" else [])
    full = load_settings({"plan": "full"})
    assert full.of("train", "steps") == 7 and "flux/dp2/native/fp32/train" in full.compile_cases
    assert load_settings({}).of("train", "steps") == 3 and "train_steps" not in preset("quick")  # another plan's


def test_lists_from_command_line_and_tolerances_from_pyproject(project):
    table = '[tool.harness]\nlayouts = ["tp2"]\n[tool.harness.tensor]\nfp32 = 2e-6\n'
    (project / "pyproject.toml").write_text(table)
    settings = load_settings({"models": "flux, qwenimage"})
    assert settings.models == ["flux", "qwenimage"]
    assert settings.layouts == ["tp2"]
    assert settings.limits("tensor", "fp32") == 2e-6
    assert settings.limits("tensor", "bf16") == 0.15


def test_unknown_key_is_named(project):
    (project / "pyproject.toml").write_text("[tool.harness]\ncase_timout = 3\n")
    with pytest.raises(HarnessError, match="case_timout"):
        load_settings()


def test_paths_are_relative_to_the_pyproject(project):
    (project / "sub").mkdir()
    settings = load_settings(start=project / "sub")
    assert settings.path("references") == project / "references"
