"""The orchestrator: settings, plan, launches, verdicts, results and reports (one process)."""
