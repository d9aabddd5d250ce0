"""What a rank tells the launcher, typed: one JSON line per event in its `rank<N>.jsonl`, flushed per line, and why
the launcher gave up on a case in flight.

The worker writes these (harness.engine.worker), the launcher and the node agents read them (harness.run.launch,
harness.run.nodes); a line that is not one of them is an error, not something to skip.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from enum import StrEnum

from harness.core.records import CaseRecord


class EventType(StrEnum):
    HELLO = "hello"  # the rank is up: imports, init and rendezvous done
    START = "start"  # a case begins
    RANK_ERROR = "rank_error"  # this rank's case raised (its traceback)
    RESULT = "result"  # rank 0's record of a case
    FATAL = "fatal"  # the rank failed outside any case (startup, the loop, cleanup)
    DONE = "done"  # every case of the group ran


class Problem(StrEnum):
    """Why a launch stopped before the case in flight reported (what the case's ERROR or TIMEOUT says)."""

    AGENT_LOST = "agent_lost"  # another node's torchrun agent died
    NODE_SILENT = "node_silent"  # another node's harness agent stopped reporting
    RANK_DIED = "rank_died"  # a rank's process is gone without an error of its own
    EXITED = "exited"  # torchrun exited
    STARTUP = "startup"  # no rank said hello in time
    RANK_ERROR = "rank_error"  # a rank raised and the others wait in a collective
    HUNG = "hung"  # no rank uses CPU time
    TIMEOUT = "timeout"  # the case timeout

    @property
    def stuck(self) -> bool:
        """The ranks are alive but stuck: their stacks are asked for before they are killed."""
        return self in (Problem.HUNG, Problem.TIMEOUT)


@dataclass(frozen=True)
class Hello:
    rank: int
    time: float
    pid: int
    node: int = 0
    host: str = "?"


@dataclass(frozen=True)
class Start:
    rank: int
    time: float
    case_id: str


@dataclass(frozen=True)
class RankError:
    rank: int
    time: float
    case_id: str
    message: str
    traceback: str = ""


@dataclass(frozen=True)
class Fatal:
    rank: int
    time: float
    pid: int
    stage: str  # startup, run or cleanup
    message: str
    traceback: str = ""


@dataclass(frozen=True)
class Result:
    rank: int
    time: float
    record: CaseRecord


@dataclass(frozen=True)
class Done:
    rank: int
    time: float


_TYPES = {EventType.HELLO: Hello, EventType.START: Start, EventType.RANK_ERROR: RankError, EventType.FATAL: Fatal,
          EventType.RESULT: Result, EventType.DONE: Done}
Event = Hello | Start | RankError | Fatal | Result | Done


def to_line(event: Event) -> str:
    """The event as its JSON line (without the newline)."""
    import json

    kind = next(name for name, cls in _TYPES.items() if isinstance(event, cls))
    data = {"rank": event.rank, "time": event.time, **event.record.to_dict()} if isinstance(event, Result) \
        else asdict(event)
    return json.dumps({"event": kind.value, **data})


def from_dict(data: dict) -> Event:
    """The typed event of a JSON line's dict; a line of no known type, or with unknown fields, raises ValueError."""
    kind = EventType(data.get("event"))
    if kind is EventType.RESULT:
        return Result(data["rank"], data["time"], CaseRecord.from_dict(data))
    cls = _TYPES[kind]
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known - {"event"}
    if unknown:
        raise ValueError(f"{kind.value} event with unknown fields {sorted(unknown)}")
    return cls(**{key: value for key, value in data.items() if key in known})
