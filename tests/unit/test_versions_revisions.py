"""REV parsing and validation (harness.versions.revisions): releases, checkouts and refs, with one clear line for bad
input; a checkout is keyed by the git tree of its source, and reading it leaves the user's checkout as it was."""

from __future__ import annotations

import pytest

from harness.core.errors import HarnessError
from harness.versions import revisions
from harness.versions.revisions import parse_revision
from tests.unit.versions_helpers import RELEASES, fake_checkout, git, state_of

ASK_THE_INDEX = revisions.released_versions


@pytest.fixture(autouse=True)
def released(monkeypatch):
    """The package index, as it answered on the day these tests were written (no network in unit tests)."""
    monkeypatch.setattr(revisions, "released_versions", lambda: RELEASES)


def test_a_release_is_named_with_or_without_the_package_name():
    assert parse_revision("diffusers==0.38.0").version == "0.38.0"
    assert parse_revision("0.39.0").source == "release"
    assert parse_revision("installed").source == "installed"


@pytest.mark.parametrize("text, said", [
    ("diffusers==0.99.0", "diffusers 0.99.0 is not a released version; released from 0.36.0: 0.36.0, 0.37.0"),
    ("diffusers==0.35.2", "needs diffusers >= 0.36.0"),
    ("diffusers==banana", "'banana' is not a version"),
])
def test_a_bad_release_is_one_clear_line(text, said):
    with pytest.raises(HarnessError, match=said.replace("(", r"\(").replace(".", r"\.")) as caught:
        parse_revision(text)
    assert "\n" not in str(caught.value)


def test_a_checkout_is_keyed_by_its_tree_not_its_path(tmp_path):
    one = fake_checkout(tmp_path / "one", ("0.1.0",))
    two = fake_checkout(tmp_path / "two", ("0.1.0",))
    first, second = parse_revision(str(one)), parse_revision(str(two))
    assert first.tree == git(one, "rev-parse", "HEAD^{tree}") and not first.dirty
    assert first.key_material() == second.key_material()  # the same source wherever it lies
    (two / "src/diffusers/__init__.py").write_text('__version__ = "0.1.1"\n')  # negative control: other content
    assert parse_revision(str(two)).key_material() != first.key_material()


def test_a_ref_names_the_commit_it_points_at(tmp_path):
    repo = fake_checkout(tmp_path / "repo", ("0.1.0", "0.2.0"))
    at = parse_revision(f"{repo}@v0.1.0")
    assert at.commit == git(repo, "rev-parse", "v0.1.0") != git(repo, "rev-parse", "HEAD")
    assert at.label.endswith("(v0.1.0)")


def test_a_dirty_working_tree_is_a_snapshot_and_stays_as_it_was(tmp_path):
    repo = fake_checkout(tmp_path / "repo")
    (repo / "src/diffusers/__init__.py").write_text('__version__ = "changed"\n')
    before = state_of(repo)
    revision = parse_revision(str(repo))
    assert revision.dirty and revision.tree != git(repo, "rev-parse", "HEAD^{tree}")
    assert git(repo, "show", f"{revision.commit}:src/diffusers/__init__.py") == '__version__ = "changed"'
    assert state_of(repo) == before  # HEAD, branch, status, stash and worktrees untouched


@pytest.mark.parametrize("make, text, said", [
    (lambda tmp: tmp / "missing", "{}", "is not a folder"),
    (lambda tmp: (tmp / "plain").mkdir() or tmp / "plain", "{}", "is not a diffusers checkout: not a git repository"),
    (lambda tmp: fake_checkout(tmp / "other", layout="src/other"), "{}", "has no src/diffusers/__init__.py"),
    (lambda tmp: fake_checkout(tmp / "repo"), "{}@no-such-branch", "no commit or ref 'no-such-branch'"),
])
def test_a_bad_checkout_is_one_clear_line(tmp_path, make, text, said):
    folder = make(tmp_path)
    with pytest.raises(HarnessError, match=said) as caught:
        parse_revision(text.format(folder))
    assert "\n" not in str(caught.value)


def test_the_release_list_parses_what_pip_prints(monkeypatch):
    class Done:
        returncode, stdout = 0, "diffusers (0.42.1)\nAvailable versions: 0.42.1, 0.40.0, 0.9.0, 0.39.0\n"

    monkeypatch.setattr(revisions.subprocess, "run", lambda *args, **kwargs: Done())
    assert ASK_THE_INDEX.__wrapped__() == ("0.9.0", "0.39.0", "0.40.0", "0.42.1")  # by version, not as text
