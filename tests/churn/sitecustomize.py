"""Put on PYTHONPATH by tests/unit/test_races.py: every rank process (the harness's worker) keeps starting and
reaping short-lived children in a background thread, as a rank compiling with Inductor does (its compile workers
and the C++ compiler come and go), while the launcher walks the ranks' process trees. Nothing else is touched."""

import subprocess
import threading

with open("/proc/self/cmdline", "rb") as _cmdline:  # sys.argv is not set yet while site runs
    _RANK = b"harness.engine.worker" in _cmdline.read()

if _RANK:

    def _churn() -> None:
        while True:  # a child, and a child with a grandchild of its own, each gone a moment later
            subprocess.run(["true"], check=False)
            subprocess.run(["sh", "-c", "true & wait"], check=False)

    threading.Thread(target=_churn, name="churn", daemon=True).start()
