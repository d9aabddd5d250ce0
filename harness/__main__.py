from harness.cli import entry

raise SystemExit(entry())
