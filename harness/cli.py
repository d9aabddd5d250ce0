"""`harness capture | run | merge | selftest | report | backends | models | ab | bisect | repro`: user errors end
with a message and exit code."""

from __future__ import annotations

import argparse
import gc
import signal
import sys
import textwrap
import time
from pathlib import Path

from harness import faults
from harness.core.errors import HarnessError, process_age_s
from harness.run.handover import RunStopped
from harness.run.settings import OPTIONS, RUN_OPTIONS, load_settings, split_list

IMPORTED = time.monotonic()  # where the wall starts where the process's own start cannot be read
# When the command started, where this process's start is not it: the monotonic time at which `python -m harness`
# started, when that process handed the command to a warm parent to run in a fork (`forked`).
STARTED: float | None = None


def add_options(parser: argparse.ArgumentParser, names, in_force: dict) -> None:
    for name in names:
        option = OPTIONS[name]
        flag, value = f"--{name.replace('_', '-')}", in_force.get(name, option.default)
        origin = "" if value == option.default else " (from pyproject.toml)"
        text = f"{option.help} {option.where()}; default here: {_show(value)}{origin}."
        if isinstance(option.default, bool):
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=text)
            continue
        kind = type(option.default) if not option.is_list and option.default is not None else str
        parser.add_argument(flag, dest=name, type=kind, default=None, help=text)


def _in_force() -> dict:
    """The option values `[tool.harness]` sets for this folder (the quick plan's), so `--help` shows what applies."""
    try:
        return load_settings({"models": None}).values
    except HarnessError:
        return {}


def _show(value) -> str:
    return ",".join(value) if isinstance(value, list) else str(value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harness", description=__doc__.split(":")[0])
    in_force = _in_force()  # read once: [tool.harness] of this folder, shown as each flag's default
    commands = parser.add_subparsers(dest="command", required=True)
    capture = commands.add_parser("capture", help="Capture fp32 single-device references into references/.")
    add_options(capture, ("models", "kinds", "train_models", "train_steps", "weights", "references"), in_force)
    capture.add_argument("--shapes", default=None, help="Only these shapes, comma-separated (default: every shape).")
    capture.add_argument("--force", action="store_true", help="Replace existing references.")
    run = commands.add_parser("run", help="Run the parity matrix under torchrun and write reports/.")
    add_options(run, RUN_OPTIONS, in_force)
    run.add_argument("--resume", action="store_true", help="Keep the finished cases of an interrupted run.")
    run.add_argument("--inject-fault", default=None, metavar="FAULT",
                     help="Run every case with a deliberate bug, to see it FAIL: " + ", ".join(faults.usages()) + ".")
    selftest = commands.add_parser("selftest", help="Run the negative controls; exit 0 only if each bug is caught.")
    add_options(selftest, ("references", "case_timeout", "cpu_max_ranks", "budget_factor"), in_force)
    selftest.add_argument("--report-dir", dest="report_dir", default="reports/selftest", help="Where to write.")
    selftest.add_argument("--localize", action="store_true",
                          help="Instead: a bug in one module each; localization must name that module first.")
    selftest.add_argument("--flows", default=None, metavar="FLOWS",
                          help="Only the generated controls of these flows, comma-separated, or all (every rank but "
                               "rank 0 leaves the flow's calls out); default: every control and every flow's.")
    models = commands.add_parser("models", help="List diffusers' transformers with a parallel plan and the harness's "
                                                "coverage.")
    models.add_argument("--check", action="store_true", help="Also check each plan against the module tree (meta "
                        "device, zoo and default configs): keys, split/gather pairs, attention in the split region, "
                        "TP pairs and degrees 2 and 4. Exit 1 on an error finding.")
    commands.add_parser("backends", help="List diffusers' attention backends: usable here (probed), why not, CP.")
    merge = commands.add_parser("merge", help="Merge the reports of the parts of a `--shard K/N` run into one.")
    merge.add_argument("parts", nargs="+", metavar="DIR", help="The --report-dir of each part.")
    add_options(merge, ("report_dir",), in_force)
    report = commands.add_parser("report", help="Re-render index.html from results.json, or compare two runs.")
    add_options(report, ("report_dir",), in_force)
    report.add_argument("--compare", nargs=2, metavar=("OLD_DIR", "NEW_DIR"), default=None,
                        help="Show the cases whose status changed between two runs (e.g. main vs a branch).")
    from harness.versions import cli as versions_cli

    versions_cli.add_commands(commands, in_force, add_options)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, unwound like Ctrl-C: the launcher's finally-blocks kill the worker group on the way out
    (Python's default for these signals exits at once and leaves torchrun and its ranks running)."""


def _terminate(signum, _frame) -> None:
    raise Terminated(signum)


def entry() -> int:
    """`harness` and `python -m harness`: in a fork of the warm parent a pytest session shares with the commands its
    tests start, which has torch and diffusers imported, when there is one for this environment; else here."""
    from harness.run import warm

    code = warm.run_in_shared(sys.argv, f"{__name__}:{forked.__name__}", imports=("harness.run.runner",))
    code = main() if code is None else code
    # What is left is torch's and diffusers' module graph, whose collection as the interpreter ends takes 0.7 s
    # (0.1 s frozen): the user would wait for it after the summary. Exit functions and flushes still run.
    gc.freeze()
    return code


def forked(argv: list[str], started: float) -> int:
    """`main` in a fork of a warm parent (harness.run.warm.run_in_shared), for a command that started at `started`
    (time.monotonic) in another process."""
    global STARTED
    STARTED = started
    return main(argv)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous = {signum: signal.signal(signum, _terminate) for signum in (signal.SIGTERM, signal.SIGHUP)
                if signal.getsignal(signum) is not signal.SIG_IGN}  # `nohup harness run` keeps running on a hangup
    try:
        return COMMANDS[args.command](args)
    except RunStopped as stopped:  # its one line is said; the reports of the finished cases are written
        return stopped.exit_code
    except HarnessError as error:
        print(f"harness: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt as interrupt:
        print("harness: interrupted", file=sys.stderr)
        return 128 + interrupt.args[0] if isinstance(interrupt, Terminated) else 130
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _settings(args):
    overrides = {name: getattr(args, name) for name in OPTIONS if hasattr(args, name)}
    return load_settings(overrides)


def cmd_capture(args) -> int:
    from harness.run.capture import capture_all

    settings = _settings(args)
    shapes = split_list(args.shapes) if args.shapes else None
    capture_all(settings.models, settings.path("references"), args.force, settings.kinds, settings.weights,
                shapes=shapes, settings=settings)
    return 0


def cmd_run(args) -> int:
    from harness.run import warm
    from harness.run.folders import launches_folder
    from harness.run.launchers import launcher_from
    from harness.run.lock import report_folder_lock
    from harness.run.nodes import NodeAgent

    settings = _settings(args)
    launcher = launcher_from(settings)
    command = launcher.hand_off(_forwarded(args))
    if command is not None:
        return _hand_off(launcher, command, settings, _forwarded(args))
    if launcher.node_rank > 0:  # this node only runs ranks: node 0 plans, judges and reports
        return NodeAgent(launches_folder(settings.path("report_dir")), launcher).run()
    with report_folder_lock(settings.path("report_dir")):  # a second run into this folder is refused before it plans
        warm.start_early(settings)  # before this process imports torch and diffusers (the runner's): they overlap
        from harness.run import runner

        plan = runner.plan_from(settings, args.inject_fault)
        # The wall a user waits counts from the process's start: the interpreter and the imports too.
        started = time.monotonic() - STARTED if STARTED is not None else process_age_s()
        summary = runner.run(settings, plan, resume=args.resume,
                             plan_s=started if started is not None else time.monotonic() - IMPORTED)
    return summary.exit_code


def _forwarded(args) -> list[str]:
    """The options this `harness run` was given, as flags again, less those that say how it starts (for srun)."""
    from harness.run.launchers import OWN_OPTIONS

    flags = []
    for name in RUN_OPTIONS:
        value = getattr(args, name, None)
        if value is None or name in OWN_OPTIONS:
            continue
        flag = name.replace("_", "-")
        flags.append((f"--{flag}" if value else f"--no-{flag}") if isinstance(value, bool) else f"--{flag}={value}")
    return flags + (["--resume"] if args.resume else []) + ([f"--inject-fault={args.inject_fault}"]
                                                             if args.inject_fault else [])


def _hand_off(launcher, command: list[str], settings, forwarded: list[str]) -> int:
    """Slurm: write the sbatch script (`--slurm-script`), or run srun here and return its exit code."""
    import shlex
    import shutil
    import subprocess

    if settings.slurm_script:
        path = settings.path("slurm_script")
        path.write_text(launcher.script(forwarded, Path.cwd()))
        print(f"wrote {path}; submit it with: sbatch {shlex.quote(str(path))}")
        return 0
    if shutil.which(command[0]) is None:
        raise HarnessError(f"option launcher: {command[0]} not found here; run on a Slurm login or compute node, or "
                           "write an sbatch script with --slurm-script FILE")
    print(f"running: {shlex.join(command)}", flush=True)
    return subprocess.run(command).returncode


def cmd_merge(args) -> int:
    from harness.report import matrix
    from harness.run.lock import report_folder_lock
    from harness.run.merge import merge_runs

    settings = _settings(args)
    out = settings.path("report_dir")
    with report_folder_lock(out):
        results, header = merge_runs([Path(folder) for folder in args.parts], out)
    print(matrix.terminal(results, page=str(out / "index.html")))
    print(f"merged {len(header.merged_from)} parts, {len(results)} cases: {matrix.counts_line(results)}; "
          f"wrote {out / 'results.json'}, {out / 'index.html'}, {out / 'matrix.csv'}, {out / 'matrix.md'}")
    strict = bool(header.settings.get("xfail_strict"))
    return 1 if any(result.status.is_failure(strict) for result in results) else 0


def cmd_selftest(args) -> int:
    from harness.run import warm

    settings = _settings(args)
    warm.start_early(settings)  # before this process imports torch and diffusers (the selftest's): they overlap
    from harness.run.selftest import localize_selftest, selftest

    if args.localize:
        return localize_selftest(settings)
    if args.flows is None:
        return selftest(settings)
    from harness import flows

    chosen = None if args.flows == "all" else [flows.value_of(name).name for name in args.flows.split(",")]
    return selftest(settings, flow_values=chosen, table=False)


def cmd_report(args) -> int:
    """Re-render index.html; or compare two runs: Markdown, then one summary line that names the page written.
    Exit 1 when a case newly fails (a CI gate; see harness.report.compare), 2 when a results.json is missing."""
    import os

    from harness.report import changed_markdown, compare_runs, render_html

    if args.compare is None:
        print(f"wrote {render_html(_settings(args).path('report_dir'))}")
        return 0
    old, new = (Path(folder) for folder in args.compare)
    comparison = compare_runs(old, new)
    text = changed_markdown(comparison)
    print(text)
    wrote = ", ".join(str(path) for path in comparison.wrote)
    verdict = "; exit 1: a case newly fails" if comparison.exit_code else ""
    print(f"compare: {comparison.summary()}; wrote {wrote}{verdict}")
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as handle:
            handle.write(f"## Status changes: {old} -> {new}\n\n{text}\n")
    return comparison.exit_code


def cmd_backends(args) -> int:
    from harness.core import determinism
    from harness.rank import backends
    from harness.report.matrix import WIDTH

    determinism.quiet_diffusers()
    rows = backends.backend_table()
    columns = ["backend", "context_parallel", "fp32", "bf16", "kernels_checked", "reason"]
    cells = [[str(row[c]).replace("RuntimeError: ", "") for c in columns] for row in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns[:-1])]
    indent = sum(widths) + 2 * len(widths)
    for line in [columns, *cells]:  # the reason wraps under itself, so every line fits in the terminal's WIDTH
        lead = "  ".join(value.ljust(width) for value, width in zip(line, widths, strict=False)) + "  "
        wrapped = textwrap.wrap(line[-1], max(WIDTH - indent, 30)) or [""]
        print(lead + wrapped[0])
        for more in wrapped[1:]:
            print(" " * indent + more)
    usable = sum(row["fp32"] == "usable" or row["bf16"] == "usable" for row in rows)
    print(f"\n{usable} of {len(rows)} backends usable on {backends.default_device().type}")
    problems = backends.registry_problems()
    for problem in dict.fromkeys(problems.values()):
        print(f"registry: {problem}")
    if not problems:
        print(f"registry: {len(backends.registry_held())} names, each holding the function the harness's catalogue "
              "says it must")
    return 0


def cmd_models(args) -> int:
    from harness.catalogue.zoo import NOT_COVERED, SPECS
    from harness.catalogue.zoo.discover import import_failures, parallel_classes
    from harness.core import determinism

    determinism.quiet_diffusers()
    rows = parallel_classes()
    print(f"{'class':34s} {'_cp_plan':9s} {'_tp_plan':9s} {'spec':12s} shapes / why not covered")
    for row in rows:
        spec = SPECS.get(row["spec"]) if row["spec"] else None
        detail = ", ".join(spec.shapes) if spec else NOT_COVERED.get(row["class_name"], "NOT COVERED: no spec")
        print(f"{row['class_name']:34s} {'yes' if row['has_cp_plan'] else '-':9s} "
              f"{'yes' if row['has_tp_plan'] else '-':9s} {row['spec'] or '-':12s} {detail}")
    for module, error in import_failures():
        print(f"could not import {module}: {error}")
    covered = sum(1 for row in rows if row["spec"])
    print(f"\n{covered} of {len(rows)} classes with a parallel plan have a spec")
    if not args.check:
        return 0
    from harness.catalogue import (
        checks as plan_checks,  # --check: each plan against its module trees; exit 1 on an error finding
    )

    findings, trees = plan_checks.check_all()
    print("\n" + plan_checks.format_table(findings))
    print(plan_checks.summary(findings, len(rows), trees))
    return 1 if any(row.severity == "error" for row in findings) else 0


def _versions_command(name: str):
    def command(args) -> int:
        from harness.versions import cli as versions_cli

        return versions_cli.COMMANDS[name](args)

    return command


COMMANDS = {"capture": cmd_capture, "run": cmd_run, "merge": cmd_merge, "selftest": cmd_selftest, "report": cmd_report,
            "models": cmd_models, "backends": cmd_backends, **{name: _versions_command(name)
                                                               for name in ("ab", "bisect", "repro")}}


if __name__ == "__main__":
    raise SystemExit(main())
