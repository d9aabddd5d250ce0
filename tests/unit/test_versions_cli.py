"""The command lines of ab, bisect and repro: bad input is one line on stderr and exit 2, before anything is built;
the plan options pass through to each revision's `harness run` as given."""

from __future__ import annotations

import pytest

from harness import cli
from harness.versions import cli as versions_cli
from harness.versions import revisions
from tests.unit.versions_helpers import RELEASES, fake_checkout


@pytest.fixture(autouse=True)
def released(monkeypatch):
    monkeypatch.setattr(revisions, "released_versions", lambda: RELEASES)


def one_error_line(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("harness: error: ")
    return err[0]


def test_bad_revisions_are_one_line(tmp_path, capsys):
    repo = fake_checkout(tmp_path / "repo")
    plain = tmp_path / "plain"
    plain.mkdir()
    env = f"--env-cache={tmp_path / 'cache'}"
    assert "not a released version" in one_error_line(capsys, ["ab", "--base", "diffusers==0.99.0", "--head",
                                                               "installed", env])
    assert "not a git repository" in one_error_line(capsys, ["ab", "--base", str(plain), "--head", "installed", env])
    assert "no commit or ref 'nope'" in one_error_line(capsys, ["ab", "--base", "installed", "--head",
                                                                f"{repo}@nope", env])
    assert not (tmp_path / "cache").exists()  # nothing was built


def test_a_case_outside_the_plan_is_one_line(tmp_path, capsys):
    said = one_error_line(capsys, ["bisect", "--good", "diffusers==0.42.1", "--bad", "diffusers==0.36.0", "--case",
                                   "wan@masked/ulysses2/native/fp32/tensor", f"--env-cache={tmp_path}"])
    assert "wan@masked/ulysses2/native/fp32/tensor is not in the plan" in said
    assert "is not of the form" in one_error_line(capsys, ["repro", "flux/ulysses2/native/fp32/train+wrong_grad"])


def test_the_plan_options_pass_through_as_given():
    args = cli.build_parser().parse_args(["ab", "--base", "installed", "--head", "installed", "--models", "flux",
                                          "--no-check-refusals", "--train-steps", "2", "--localize"])
    flags = versions_cli.forwarded(args, versions_cli.AB_OPTIONS)
    assert flags == ["--models=flux", "--no-check-refusals", "--localize", "--train-steps=2"]
    bisect = cli.build_parser().parse_args(["bisect", "--good", "a", "--bad", "b", "--case", "x,y", "--case", "z"])
    assert bisect.cases == ["x,y", "z"] and not hasattr(bisect, "models")  # the case ids make the plan
