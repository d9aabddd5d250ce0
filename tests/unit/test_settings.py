"""Option precedence: command line > [tool.harness] > default."""

import pytest

from harness.core.errors import HarnessError
from harness.run.settings import OPTIONS, load_settings


@pytest.mark.parametrize(
    ("table", "override", "expected"),
    [
        ("", None, OPTIONS["case_timeout"].default),
        ("case_timeout = 7\n", None, 7),
        ("case_timeout = 7\n", 3.0, 3.0),
        ("", 3.0, 3.0),
    ],
)
def test_precedence(project, table, override, expected):
    (project / "pyproject.toml").write_text("[tool.harness]\n" + table)
    assert load_settings({"case_timeout": override}).case_timeout == expected


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
