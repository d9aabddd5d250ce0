"""The command lines of `harness ab`, `harness bisect` and `harness repro` (added to harness.cli's parser). The plan
options are the ones `harness run` declares (harness.run.settings.RUN_OPTIONS), passed through to each revision's
`harness run` as given."""

from __future__ import annotations

import argparse

from harness.run.settings import OPTIONS, RUN_OPTIONS
from harness.versions.cases import DERIVED

# Options ab sets itself for each side's run (where references and reports go); bisect sets the reports only (every
# revision it runs compares with the same references, --references or the project's).
OWN = ("references", "report_dir")
AB_OPTIONS = tuple(name for name in RUN_OPTIONS if name not in OWN)
BISECT_OPTIONS = tuple(name for name in RUN_OPTIONS if name not in ("report_dir", *DERIVED))


def add_commands(commands, in_force: dict, add_options) -> None:
    revs = ("REV: diffusers==0.38.0 (a release), ~/diffusers (a checkout's working tree), ~/diffusers@my-branch (a "
            "ref in it) or installed (this environment's)")
    ab = commands.add_parser("ab", help="Run the plan on two diffusers revisions, each in its own cached environment, "
                                        "and report what changed. Exit 1 on a regression.", description=revs)
    ab.add_argument("--base", required=True, metavar="REV", help="The revision before (it captures the references).")
    ab.add_argument("--head", required=True, metavar="REV", help="The revision after (run against base's references).")
    ab.add_argument("--accept-known", action="store_true", help="Exit 0 when a case that passed on the base is XFAIL "
                    "on the head (excused there by a known issue), still listing it as accepted.")
    add_options(ab, AB_OPTIONS, in_force)
    _common(ab, "reports/ab")
    bisect = commands.add_parser("bisect", help="The first revision between --good and --bad at which a case's "
                                                "status changed (git bisect over a checkout, or over releases).",
                                 description=revs)
    bisect.add_argument("--good", required=True, metavar="REV", help="A revision with the status you call good.")
    bisect.add_argument("--bad", required=True, metavar="REV", help="A revision with the status you call bad "
                        "(older than --good for a search of the fix, newer for a search of the breakage).")
    bisect.add_argument("--case", dest="cases", action="append", required=True, metavar="CASE_ID",
                        help="A case id (repeat, or comma-separate, for a small set); its options make the plan.")
    add_options(bisect, BISECT_OPTIONS, in_force)
    _common(bisect, "reports/bisect")
    repro = commands.add_parser("repro", help="Write one standalone script (torch and diffusers only) that "
                                              "reproduces a case, for an upstream report.")
    repro.add_argument("case_id", metavar="CASE_ID", help="e.g. qwenimage@masked/ulysses2/native/fp32/tensor")
    repro.add_argument("--out", default=None, metavar="FILE", help="Where to write it (default: repro-<case>.py).")
    add_options(repro, ("references", "budget_factor", "budget_max_factor", "known_issues"), in_force)


def _common(parser: argparse.ArgumentParser, report_dir: str) -> None:
    parser.add_argument("--report-dir", dest="report_dir", default=report_dir,
                        help=f"Where each revision's reports and the summary go (default: {report_dir}).")
    parser.add_argument("--env-cache", default=None, metavar="DIR",
                        help="Where environments are cached (default: $HARNESS_ENV_CACHE, else "
                             "~/.cache/diffusers-parity-harness).")


def forwarded(args, names) -> list[str]:
    """The plan options given on this command line, as flags for a side's `harness run` (bools as --x/--no-x)."""
    flags = []
    for name in names:
        value = getattr(args, name, None)
        if value is None:
            continue
        flag = name.replace("_", "-")
        flags.append((f"--{flag}" if value else f"--no-{flag}") if isinstance(value, bool) else f"--{flag}={value}")
    return flags


def overrides(args) -> dict:
    """The given options as load_settings overrides (for checking case ids against the plan here)."""
    return {name: getattr(args, name) for name in OPTIONS if getattr(args, name, None) is not None
            and name not in ("report_dir",)}


def cmd_ab(args) -> int:
    from pathlib import Path

    from harness.versions import ab, envs

    flags = forwarded(args, AB_OPTIONS)
    return ab.ab(args.base, args.head, flags, Path(args.report_dir), envs.cache_root(args.env_cache),
                 accept_known=args.accept_known)


def cmd_bisect(args) -> int:
    from pathlib import Path

    from harness.versions import bisect, envs

    cases = [case.strip() for given in args.cases for case in given.split(",") if case.strip()]
    flags = forwarded(args, BISECT_OPTIONS)
    return bisect.bisect(args.good, args.bad, cases, flags, overrides(args), Path(args.report_dir),
                         envs.cache_root(args.env_cache))


def cmd_repro(args) -> int:
    from pathlib import Path

    from harness.versions.repro import write_repro

    out, command = write_repro(args.case_id, Path(args.out) if args.out else None, overrides(args))
    print(f"wrote {out}; run it alone: {command}")
    return 0


COMMANDS = {"ab": cmd_ab, "bisect": cmd_bisect, "repro": cmd_repro}
