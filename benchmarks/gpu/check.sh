#!/usr/bin/env bash
# The GPU check (benchmarks/gpu/README.md): one prepared command for a lent CUDA machine, and its CPU dry run.
#
#   bash benchmarks/gpu/check.sh [OUT] [--bundle DIR]   # on the GPU machine (about 4 of its 8 minutes on one GPU)
#   bash benchmarks/gpu/check.sh --dry-run              # here: the plan, the packages on the registry, the estimate
#   bash benchmarks/gpu/check.sh --prepare              # here: the wheelhouse for a GPU machine without a registry
#
# The work is done by check.py beside this script (standard library only until its environment exists), run by
# $PYTHON or python3: on the GPU machine the Python whose torch is a CUDA build.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
if ! command -v "$python" >/dev/null 2>&1; then
    echo "check.sh: error: no Python: $python not found (set PYTHON=/path/to/python)" >&2
    exit 3
fi
exec "$python" "$here/check.py" "$@"
