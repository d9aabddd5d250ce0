#!/usr/bin/env bash
# The project's environment, .venv: made if missing, torch==2.13.0 installed first (a bare `torch` requirement would
# pull a multi-GB CUDA build), then the project with its dev tools (`-e '.[dev]'`).
#
# One install at a time: the README's two commands, pasted into two terminals at once, both run this, and two pips
# installing into one environment read each other's half-installed packages and die. The second waits for the first
# (an flock on .venv.lock, beside .venv), then finds everything installed and returns at once: a stamp in .venv says
# what was installed (the torch pin and pyproject.toml's checksum), so a changed pyproject.toml installs again.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
TORCH=torch==2.13.0

exec 9>"$VENV.lock"
if ! flock -n 9; then
    echo "setup: another setup is installing into $VENV; waiting for it to finish" >&2
    flock 9
fi

wanted="$TORCH $(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.setup-done" 2>/dev/null)" = "$wanted" ]; then
    echo "setup: $VENV is already set up" >&2
    exit 0
fi
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
rm -f "$VENV/.setup-done"
"$VENV/bin/python" -m pip install -q "$TORCH"
"$VENV/bin/python" -m pip install -q -e '.[dev]'
echo "$wanted" > "$VENV/.setup-done"
echo "setup: $VENV is ready ($TORCH, -e '.[dev]'); activate it with: . $VENV/bin/activate" >&2
