"""The launchers by the commands they build (there is no Slurm here), the options that choose them, and where a
world size goes on several nodes."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from harness.cli import _forwarded, _settings, build_parser
from harness.core.errors import HarnessError
from harness.run.launchers import Capacity, Local, Torchrun, launcher_from
from harness.run.settings import load_settings


def _launcher(project, **options):
    return launcher_from(load_settings(options, start=project))


def test_local_is_the_default_and_stays_standalone(project):
    launcher = _launcher(project)
    assert launcher == Local()
    command = launcher.command(4, 1, "g.json", "")
    assert command[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
                           "--monitor-interval=1", "-m", "harness.engine.worker", "g.json"]


def test_torchrun_spreads_a_group_over_the_nodes_by_c10d_rendezvous(project):
    launcher = _launcher(project, launcher="torchrun", nnodes=2, node_rank=1, rdzv_endpoint="node0:29400")
    assert launcher == Torchrun(2, 1, "node0:29400")
    assert launcher.command(4, 2, "g.json", "run-3")[1:] == [
        "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
        "--rdzv-endpoint=node0:29400", "--rdzv-id=run-3", "--max-restarts=0", "--monitor-interval=1",
        "-m", "harness.engine.worker", "g.json"]
    assert "--standalone" in launcher.command(1, 1, "g.json", "")  # a group on node 0 alone


@pytest.mark.parametrize(("options", "message"), [
    ({"launcher": "torchrun", "nnodes": 2}, "option rdzv_endpoint: --launcher torchrun with --nnodes 2 needs"),
    ({"launcher": "torchrun", "nnodes": 2, "rdzv_endpoint": "node0"}, "option rdzv_endpoint: 'node0' is not HOST:PORT"),
    ({"launcher": "torchrun", "nnodes": 2, "node_rank": 2, "rdzv_endpoint": "h:1"},
     "option node_rank: 2 is not a node"),
    ({"nnodes": 2}, "option launcher: --nnodes 2 --node-rank 0 need --launcher torchrun"),
    ({"nnodes": 0}, "option nnodes: 0 is not a node count"),
    ({"slurm_script": "job.sh"}, "options slurm_script / slurm_options need --launcher slurm"),
    ({"launcher": "mpi"}, "option launcher: 'mpi' is not one of local, torchrun, slurm"),
])
def test_a_combination_that_cannot_work_names_the_option(project, options, message):
    with pytest.raises(HarnessError, match=message.replace("(", r"\(")):
        _launcher(project, **options)


def test_a_world_size_spans_every_node_when_it_divides_else_node_0_else_skip():
    gpus = Capacity(8, 2, "GPUs each")  # 2 nodes x 8 GPUs
    assert [gpus.nodes_for(size) for size in (1, 2, 4, 8, 16, 3, 32)] == [1, 2, 2, 2, 2, 1, None]
    assert gpus.skip_reason(16) is None
    assert gpus.skip_reason(32) == ("needs 32 ranks; 2 nodes x 8 GPUs each take a world size that fits one node or "
                                    "divides evenly over the nodes")
    assert gpus.skip_reason(9) is not None  # odd, and more than one node holds
    cpu = Capacity(4, 2, total=4)  # on CPU cpu_max_ranks bounds the whole run, nodes or not
    assert [cpu.nodes_for(size) for size in (1, 2, 4, 8)] == [1, 2, 2, None]
    assert cpu.skip_reason(8) == "needs 8 ranks; this machine has 4 ranks allowed on CPU (cpu_max_ranks)"


SLURM = ["--launcher", "slurm", "--nnodes", "2", "--gpus-per-node", "8",
         "--slurm-options=--partition=gpu,--time=02:00:00"]
WHAT = ["--models", "flux", "--layouts", "tp8,tp16", "--weights", "/ckpt/flux dev", "--no-check-refusals"]


def _slurm(project, argv):
    args = build_parser().parse_args(["run", *argv])
    return launcher_from(_settings(args)), _forwarded(args)


def test_slurm_runs_the_same_harness_run_on_every_node_through_srun(project):
    launcher, forwarded = _slurm(project, [*SLURM, *WHAT])
    # what to check and how many GPUs a node gives, less how to start (the order is settings.py's)
    assert forwarded == ["--models=flux", "--weights=/ckpt/flux dev", "--layouts=tp8,tp16", "--no-check-refusals",
                         "--gpus-per-node=8"]
    command = launcher.hand_off(forwarded)
    assert command[:7] == ["srun", "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=8", "--partition=gpu",
                           "--time=02:00:00", "--kill-on-bad-exit=1"]
    assert command[7:9] == ["bash", "-c"]
    per_node = command[9]
    head, run = per_node.split("; exec ")
    assert head == 'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)'
    assert shlex.split(run)[1:] == ["-m", "harness", "run", *forwarded, "--launcher", "torchrun", "--nnodes", "2",
                                    "--node-rank", "$SLURM_NODEID", "--rdzv-endpoint", "$HEAD:29500"]
    assert '"$SLURM_NODEID"' in run and '"$HEAD:29500"' in run  # expanded by each task's shell, not here


def test_slurm_script_is_an_sbatch_file_with_the_same_srun(project):
    done = subprocess.run([sys.executable, "-m", "harness", "run", *SLURM, *WHAT, "--slurm-script", "job.sh"],
                          cwd=project, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote {project / 'job.sh'}; submit it with: sbatch {project / 'job.sh'}"
    script = (project / "job.sh").read_text().splitlines()
    assert script[0] == "#!/bin/bash"
    assert [line for line in script if line.startswith("#SBATCH")] == [
        "#SBATCH --job-name=harness", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
        "#SBATCH --partition=gpu", "#SBATCH --time=02:00:00"]
    assert f"cd {project}" in script
    srun = shlex.split(script[-1])
    assert srun[:4] == ["srun", "--kill-on-bad-exit=1", "bash", "-c"]
    launcher, forwarded = _slurm(project, [*SLURM, *WHAT])
    assert srun[4] == launcher.hand_off(forwarded)[-1]  # the per-node command, as srun runs it directly
    assert not (project / "reports").exists()  # nothing ran here


def test_slurm_without_srun_says_what_to_do(project, monkeypatch):
    monkeypatch.setenv("PATH", str(project))
    done = subprocess.run([sys.executable, "-m", "harness", "run", *SLURM], cwd=project, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 2
    assert "harness: error: option launcher: srun not found here; run on a Slurm login or compute node, or write " \
           "an sbatch script with --slurm-script FILE" in done.stderr


def test_the_warm_parent_started_as_a_run_begins_is_the_one_its_launches_use(settings_for, monkeypatch):
    """`harness run` starts the warm parent before it plans (its imports overlap the plan's); what planning does to
    the launcher's environment (torch's first use of Inductor's cache sets TORCHINDUCTOR_CACHE_DIR) must not start a
    second one, which would cost every run the imports again. A change that matters to imports still does."""
    from harness.run import runner, warm
    from harness.run.launchers import node_env

    parent = warm.WarmParent()
    monkeypatch.setattr(warm, "_PARENT", parent)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    settings = settings_for(models=["flux"], layouts=["ulysses2"], kinds=["tensor"])
    try:
        warm.start_early(settings)
        early = parent.process.pid
        runner.plan_from(settings, None)
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_someone")  # as torch's first use sets it
        assert runner.forked(settings)
        parent.prepare(node_env(0))  # what the run asks before its first launch
        assert parent.process.pid == early, "planning restarted the warm parent"
        monkeypatch.setenv("PYTHONPATH", "/a/plugin/folder")  # a plugin kind's folder: the ranks import from it
        parent.prepare(node_env(0))
        assert parent.process.pid != early
    finally:
        parent.close()


@pytest.mark.parametrize("command", ["run", "selftest"])
def test_the_warm_parent_starts_before_the_command_imports_torch(project, command):
    """Its imports overlap the command's own only when it starts first: `harness run` once imported its runner, and
    torch with it, before starting it (1.2 s into the run; the first launch then waited 0.7 s for it)."""
    probe = ("import sys\nfrom harness import cli\nfrom harness.run import warm\n"
             "def early(settings):\n"
             "    print('torch ' + ('imported' if 'torch' in sys.modules else 'not imported') + ' yet')\n"
             "    raise SystemExit(0)\n"
             "warm.start_early = early\n"
             f"cli.main([{command!r}])\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=project, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "torch not imported yet"


@pytest.mark.slow
def test_a_command_the_session_starts_runs_in_a_fork_and_forks_its_ranks_from_the_sessions_warm_parents(
        project, zoo_references, one_warm_parent_for_the_commands_tests_start):
    """A `harness run` this session starts runs in a fork of the worker's warm parent for commands, and forks its
    ranks from the worker's shared warm parent, instead of importing torch and diffusers for itself and for a warm
    parent of its own; one whose environment differs (a plugin's folder on PYTHONPATH, which it and its ranks import
    from) must do neither, as those parents imported without it."""
    import os

    from harness.run import warm

    shared = one_warm_parent_for_the_commands_tests_start
    if shared is None:
        pytest.skip("no shared warm parent: CUDA ranks start under torchrun")

    def forked_by(report_dir: str, env: dict) -> tuple[set[str], set[str], str]:
        """The warm parents its launches forked from, the launchers they name, and the command's own pid."""
        command = subprocess.Popen([sys.executable, "-m", "harness", "run", "--references", str(zoo_references),
                                    "--models", "flux", "--layouts", "ulysses2", "--kinds", "tensor", "--keep-work",
                                    "--report-dir", report_dir], cwd=project, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=env)
        out, err = command.communicate(timeout=600)
        assert command.returncode == 0, out[-2000:] + err[-2000:]
        logs = list((project / f"{report_dir}.work").rglob(warm.LOG))
        assert logs, "no launch forked from a warm parent"
        lines = [line.split() for log in logs for line in log.read_text().splitlines()
                 if line.startswith("launch forked by warm parent")]
        return {line[5] for line in lines}, {line[-1] for line in lines}, str(command.pid)

    parents, launchers, pid = forked_by("same", dict(os.environ))
    assert parents == {str(shared.process.pid)}
    assert launchers and pid not in launchers  # the run was a fork, not the process the test started
    parents, launchers, pid = forked_by("other", {**os.environ, "PYTHONPATH": str(project)})
    assert parents and str(shared.process.pid) not in parents
    assert launchers == {pid}
