"""The run header of results.json, typed: what every view says about a run besides its cases (environments, counts,
settings, where the time went), written by `harness run` and `harness merge`, read by the report and `harness ab`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class RunHeader:
    environment: dict[str, Any]  # this run's versions and device (harness.core.environment)
    reference_environment: dict[str, Any]  # the references' (the first one's)
    version_mismatch: str  # "" or what differs between the two
    counts: dict[str, int]  # cases per status
    settings: dict[str, Any]  # every option's value by its flat key
    limits: dict[str, Any]  # each kind's per-dtype limits
    world_sizes: list[int]
    started: str  # ISO time
    wall_s: float
    launches: int
    time_breakdown: dict[str, Any] = field(default_factory=dict)  # harness.run.timing
    known_issues_unmatched: list[str] = field(default_factory=list)  # entries that excused nothing
    shard: dict[str, Any] | None = None  # `--shard K/N`: which part, and the plan it was cut from
    merged_from: list[dict[str, Any]] | None = None  # `harness merge`: the parts
    purpose: str = ""  # "selftest": the FAILs are the deliberate bugs the run must catch
    incomplete: str | None = None  # why the run stopped before its end (its unfinished cases are ERROR, resumable)
    coverage: dict[str, Any] | None = None  # `--coverage`: diffusers' parallel code the run executed (core.coverage)
    # what each flow, load and mode value of the run means ({axis: {value: text}}, harness.run.axis_help): the page's
    # row and column titles and its legend
    values_help: dict[str, dict[str, str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if value is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunHeader:
        """A header as results.json holds it (keys of older runs that no longer exist are left out)."""
        known = {f.name for f in fields(cls)}
        given = {key: value for key, value in data.items() if key in known}
        defaults = {"environment": {}, "reference_environment": {}, "version_mismatch": "", "counts": {},
                    "settings": {}, "limits": {}, "world_sizes": [], "started": "", "wall_s": 0.0, "launches": 0}
        return cls(**{**defaults, **given})
