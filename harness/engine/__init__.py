"""What runs inside each torchrun rank, above the kinds: the per-rank loop and its events (worker), and one case's
execution split into its parts: the rank's shared state (context), running a case with the proof of what ran
(casework), the single-device baselines (baselines) and localization (localization)."""
