"""The environment cache (harness.versions.envs): keyed by what goes in, reused when complete, built again when
half-built, and a checkout built from a worktree of ours that is gone afterwards. The build steps are recorded by a
fake runner here (the real builds run in `nox -s versions`)."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess

import pytest

from harness.core.errors import HarnessError
from harness.versions import envs, revisions
from harness.versions.revisions import Revision, parse_revision
from tests.unit.versions_helpers import RELEASES, fake_checkout, state_of

TORCH = importlib.metadata.version("torch")


class FakePip:
    """Answers each build step as pip would, records them, and fails the step named in `fail`."""

    def __init__(self, diffusers="0.38.0", torch=TORCH, fail=None):
        self.commands, self.diffusers, self.torch, self.fail = [], diffusers, torch, fail
        self.sources = {}  # folder pip installed from -> its package's text then

    def __call__(self, command, log):
        self.commands.append(command)
        text = " ".join(command)
        if self.fail and self.fail in text:
            log.write_text(log.read_text() + "ERROR: No matching distribution found for it\n")
            return subprocess.CompletedProcess(command, 1, "", "")
        for part in command:
            package = envs.Path(part) / "src/diffusers/__init__.py"
            if package.is_file():
                self.sources[part] = package.read_text()
        if command[1:3] == ["-m", "venv"]:
            (envs.Path(command[3]) / "bin").mkdir(parents=True, exist_ok=True)
        if command[1] == "-c":  # the probe of the versions it got
            payload = {"torch": self.torch, "diffusers": self.diffusers, "diffusers_at": "x"}
            return subprocess.CompletedProcess(command, 0, json.dumps(payload) + "\n", "")
        return subprocess.CompletedProcess(command, 0, "", "")


@pytest.fixture(autouse=True)
def released(monkeypatch):
    monkeypatch.setattr(revisions, "released_versions", lambda: RELEASES)
    monkeypatch.delenv(envs.TORCH_ENV, raising=False)


def test_a_second_request_builds_nothing(tmp_path):
    pip = FakePip()
    first = envs.env_for(parse_revision("diffusers==0.38.0"), tmp_path, echo=lambda line: None, run=pip)
    built = len(pip.commands)
    again = envs.env_for(parse_revision("diffusers==0.38.0"), tmp_path, echo=lambda line: None, run=pip)
    assert first.folder == again.folder and first.built_s is not None and again.built_s is None
    assert len(pip.commands) == built  # reused: no step ran
    installs = [" ".join(command) for command in pip.commands if "install" in command]
    assert installs[0].endswith(f"torch=={TORCH.split('+')[0]}")
    assert "diffusers==0.38.0" in installs[1] and "--no-deps -e" in installs[2]
    assert not any("torch" in item or "diffusers" in item for item in envs.harness_dependencies())


def test_a_half_built_environment_is_built_again(tmp_path):
    pip = FakePip(fail="diffusers==0.38.0")
    with pytest.raises(HarnessError, match="install diffusers==0.38.0 failed .*No matching distribution"):
        envs.env_for(parse_revision("diffusers==0.38.0"), tmp_path, echo=lambda line: None, run=pip)
    pip.fail, pip.commands = None, []
    env = envs.env_for(parse_revision("diffusers==0.38.0"), tmp_path, echo=lambda line: None, run=pip)
    assert pip.commands and (env.folder / envs.MARKER).is_file()


def test_the_key_follows_what_goes_in(tmp_path, monkeypatch):
    release = parse_revision("diffusers==0.38.0")
    key = envs.env_key(envs.key_material(release))
    assert envs.env_key(envs.key_material(parse_revision("diffusers==0.38.0"))) == key
    assert envs.env_key(envs.key_material(parse_revision("diffusers==0.39.0"))) != key
    monkeypatch.setenv(envs.TORCH_ENV, "torch==2.13.0+cu128")
    assert envs.env_key(envs.key_material(release)) != key  # another torch requirement, another environment
    monkeypatch.delenv(envs.TORCH_ENV)
    root = tmp_path / "harness"
    root.mkdir()
    text = (envs.harness_root() / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(text)
    monkeypatch.setattr(envs, "harness_root", lambda: root)
    assert envs.env_key(envs.key_material(release)) == key
    (root / "pyproject.toml").write_text(text + "\n[tool.other]\nsetting = 1\n")  # settings install nothing
    assert envs.env_key(envs.key_material(release)) == key
    (root / "pyproject.toml").write_text(text.replace('"pandas",', '"pandas>=2",'))  # a requirement does
    assert envs.env_key(envs.key_material(release)) != key


def test_another_torch_than_this_one_is_refused(tmp_path):
    with pytest.raises(HarnessError, match=re.escape(f"got torch 0.0.1, this one has {TORCH}: set HARNESS_TORCH")):
        envs.env_for(parse_revision("diffusers==0.38.0"), tmp_path, echo=lambda line: None,
                     run=FakePip(torch="0.0.1"))


def test_a_wrong_diffusers_is_refused(tmp_path):
    with pytest.raises(HarnessError, match="got diffusers 0.37.0"):
        envs.env_for(parse_revision("diffusers==0.38.0"), tmp_path, echo=lambda line: None,
                     run=FakePip(diffusers="0.37.0"))


def test_a_checkout_builds_from_a_worktree_that_is_gone_afterwards(tmp_path):
    repo = fake_checkout(tmp_path / "repo", ("0.1.0", "0.2.0"))
    before = state_of(repo)
    pip = FakePip(diffusers="0.1.0")
    env = envs.env_for(parse_revision(f"{repo}@v0.1.0"), tmp_path / "cache", echo=lambda line: None, run=pip)
    [(folder, text)] = pip.sources.items()
    assert text == '__version__ = "0.1.0"\n'  # the ref's source, not the checkout's HEAD (0.2.0)
    assert not envs.Path(folder).exists() and state_of(repo) == before  # no worktree left, checkout as it was
    assert env.folder.name.startswith("git-")


def test_installed_is_this_environment():
    env = envs.env_for(Revision("installed", "installed"), envs.Path("/nonexistent"), echo=lambda line: None)
    assert env.python == envs.Path(envs.sys.executable) and env.folder is None


def test_an_environment_gets_what_the_flows_need_and_its_key_says_so(tmp_path, monkeypatch):
    from harness import flows

    needs = {need for flow in flows.REGISTERED.values() for need in flow.needs if not need.startswith("diffusers.")}
    assert needs and set(envs.flow_packages()) == needs  # from the registry: peft for the LoRA flows
    assert not any(name.startswith("diffusers") for name in envs.flow_packages())  # a cache's hooks: the revision's
    pip = FakePip()
    envs.env_for(parse_revision("diffusers==0.38.0"), tmp_path, echo=lambda line: None, run=pip)
    install = next(command for command in pip.commands if "diffusers==0.38.0" in command)
    assert set(envs.flow_packages()) <= set(install)
    key = envs.env_key(envs.key_material(parse_revision("diffusers==0.38.0")))
    monkeypatch.setattr(envs, "flow_packages", lambda: [])  # negative control: without them, another environment
    assert envs.env_key(envs.key_material(parse_revision("diffusers==0.38.0"))) != key


def test_a_side_runs_the_asking_checkouts_harness_first():
    """A cached environment's editable harness is the checkout that built it, maybe an older one without the flows a
    case names: the side's path starts with this checkout."""
    from harness.versions.sides import this_harness

    assert this_harness()["PYTHONPATH"].split(envs.os.pathsep)[0] == str(envs.harness_root())
