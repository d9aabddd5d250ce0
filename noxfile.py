"""CI sessions: `nox -s tests` (the harness's own tests), `nox -s capture`, `nox -s parity` (matrix + reports),
`nox -s coverage` (the matrix with diffusers' parallel code measured), `nox -s compat` (the quick plan on each supported diffusers release), `nox -s versions` (`harness ab`, `bisect` and
`repro` on real releases, each in an environment of its own), `nox -s gpu` (the GPU check's dry run; on a CUDA
machine, the check: benchmarks/gpu/README.md); none of these three is a default session."""

import fnmatch
import json
import os
from pathlib import Path

import nox

nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "venv"

# The CPU build by default; on a CUDA machine set HARNESS_TORCH to the torch requirement you want.
TORCH = os.environ.get("HARNESS_TORCH", "torch==2.13.0")


def install(session: nox.Session) -> None:
    session.install(TORCH)
    session.install("-e", ".[dev]")


@nox.session
def tests(session: nox.Session) -> None:
    """The harness's own tests (unit, negative controls, plugin) and the parity matrix as pytest items."""
    install(session)
    session.run("pytest", "-n", "2", *session.posargs)


@nox.session
def capture(session: nox.Session) -> None:
    """Capture missing fp32 references (pass --force to replace them)."""
    install(session)
    session.run("harness", "capture", *session.posargs)


@nox.session
def parity(session: nox.Session) -> None:
    """Run the parity matrix and write reports/ (matrix.csv, matrix.md, results.json, index.html)."""
    install(session)
    session.run("harness", "run", *session.posargs)


@nox.session
def coverage(session: nox.Session) -> None:
    """The parity matrix with every rank under coverage.py (`harness run --coverage`): reports/ says which of
    diffusers' parallel code the plan executed and why the rest did not run (docs/coverage.md)."""
    install(session)
    session.run("harness", "run", "--coverage", *session.posargs)


@nox.session
def compile_all(session: nox.Session) -> None:
    """Every compiled mode on every case of the plan (`harness run --modes all`), beyond the plans' compile slices:
    the nightly opt-in. Hours on a CPU (docs/compile.md has the measured cost per case); on a GPU, minutes."""
    install(session)
    session.run("harness", "run", "--modes", "all", *session.posargs)


@nox.session
def gpu(session: nox.Session) -> None:
    """The GPU check (benchmarks/gpu/check.sh) in this session's environment: its dry run by default; on a CUDA
    machine, with HARNESS_TORCH a CUDA torch requirement, `nox -s gpu -- OUT` runs the check itself."""
    install(session)
    python = str(Path(session.bin) / "python")
    session.run("bash", "benchmarks/gpu/check.sh", *(session.posargs or ["--dry-run"]), env={"PYTHON": python},
                external=True)


# Every diffusers release with context parallelism that the harness is checked on (harness/core/compat.py has the
# minimum).
RELEASES = ["0.36.0", "0.38.0", "0.40.0", "0.42.1"]
# The silent wrong results each release gives on the quick plan (globs over case ids), traced in docs/older-releases.md
# ("Older diffusers releases"). They stay FAIL in the matrix: finding them is what the harness is for. `nox -s compat`
# fails on any other FAIL, ERROR or TIMEOUT, and on a listed finding that no longer reproduces.
FINDINGS = {
    # QwenImageTransformer2DModel ignores encoder_hidden_states_mask (padding is attended), every layout, forward and
    # training (the quick plan trains it masked on dp2 only: CP training on native cannot run on 0.36); fixed in 0.37
    "0.36.0": ["qwenimage@masked/*/*/fp32/tensor", "qwenimage@masked/*/*/fp32/train"],
    # Ulysses applies the full-sequence joint text mask to its all-to-all key layout, forward and training; fixed in
    # 0.39 (#13756). Ring's backward reuses the local key/value chunk and iteration 0's out/lse at every step, and
    # _native_flash's backward transposes its saved key/value a second time: silently wrong gradients at every ring
    # degree; both fixed in 0.40.0 (#14274 and the op's rework, read in the wheels).
    "0.38.0": ["qwenimage@masked/ulysses[0-9]/native/*/tensor", "qwenimage@masked/ulysses[0-9]/native/*/train",
               "qwenimage@masked/dp2xulysses[0-9]/native/*/train", "*/ring[0-9]/_native_flash/*/train",
               "*/ring[0-9]xulysses[0-9]/_native_flash/*/train"],
    "0.40.0": [],
    "0.42.1": [],
}


@nox.session
@nox.parametrize("diffusers", RELEASES, ids=RELEASES)
def compat(session: nox.Session, diffusers: str) -> None:
    """The quick plan (default and masked shapes) on one diffusers release, in its own environment, against the
    committed references: every case PASS, XFAIL or SKIP with a reason, except that release's known findings."""
    session.install(TORCH)
    session.install(f"diffusers=={diffusers}")
    session.install("-e", ".")  # the harness requires only diffusers >= the minimum: the pinned release stays
    session.run("python", "-c", f"import diffusers, sys; v = diffusers.__version__; "
                f"sys.exit(None if v == {diffusers!r} else f'diffusers {{v}} installed, {diffusers} wanted')")
    session.run("pytest", "-q", "tests/unit/test_compat.py", "tests/unit/test_known_issues.py")
    report_dir = Path("reports") / f"diffusers-{diffusers}"
    session.run("harness", "run", "--shapes", "default,masked", "--report-dir", str(report_dir), *session.posargs,
                success_codes=[0, 1])
    problems = check_findings(json.loads((report_dir / "results.json").read_text())["cases"], FINDINGS[diffusers])
    if problems:
        session.error(f"diffusers {diffusers}: " + "; ".join(problems))


def check_findings(cases: list[dict], findings: list[str]) -> list[str]:
    """What differs from the expected outcome: an unexpected FAIL/ERROR/TIMEOUT, a SKIP without a reason, a finding
    that no longer reproduces."""
    bad = [case for case in cases if case["status"] in ("FAIL", "ERROR", "TIMEOUT")]
    problems = [f"{case['status']} {case['case_id']}: {case['reason']}" for case in bad
                if not any(fnmatch.fnmatchcase(case["case_id"], glob) for glob in findings)]
    problems += [f"SKIP without a reason: {case['case_id']}" for case in cases
                 if case["status"] == "SKIP" and not case["reason"]]
    problems += [f"finding {glob} no longer reproduces (no FAIL matches it)" for glob in findings
                 if not any(fnmatch.fnmatchcase(case["case_id"], glob) and case["status"] == "FAIL" for case in bad)]
    return problems


@nox.session
def versions(session: nox.Session) -> None:
    """`harness ab` between 0.38.0 and 0.39.0 both ways, `harness bisect` over the releases 0.36.0-0.42.1 and over
    a git repository of their sources, and the repro script of a 0.42.1 finding (tests marked `versions`). Builds an
    environment per release into the environment cache (HARNESS_ENV_CACHE, default ~/.cache/diffusers-parity-harness),
    which the next run reuses: about an hour cold on 2 cores, minutes warm (docs/versions.md)."""
    install(session)
    session.run("pytest", "-m", "versions", "-v", *session.posargs, env={"HARNESS_VERSIONS_TESTS": "1"})
