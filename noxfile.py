"""CI sessions: `nox -s tests` (the harness's own tests), `nox -s capture`, `nox -s parity` (matrix + reports)."""

import os

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
