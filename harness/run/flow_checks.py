"""What a flow case's calls did, judged (harness.flows): shown call by call, and held to what each declares.

- `flow_effect`: a call declared to change one device's output that moved it within the kind's limit did nothing
  the case could compare (a hot swap that swapped in nothing); one declared to keep it that moved it beyond did
  something else; a flow that leaves a change in place whose whole effect stays within the limit, likewise.
- `flow_equals`: after the calls one device must equal the model they stand for, reached another way (a hot swap:
  the second LoRA loaded directly; an unload: the plain model).
- `flow_calls`: every rank's calls must change the model as one device's did, in the case's dtype and backend
  (harness.flows.state): a rank that left a call out is seen even where the call keeps the numbers.
"""

from __future__ import annotations

from harness.core.evidence import Evidence
from harness.core.figures import table
from harness.flows import state

TITLE = "What the user called"


def failures(result, record, limit: float | None) -> list[Evidence]:
    """The flow's block (each call, what it did on one device, and against what it is held) and its failed checks;
    none for a case without a flow."""
    flow = (record.metrics or {}).get("flow")
    if flow is None:
        return []
    when = f"{flow['position']} enable_parallelism (one device: the same calls)"
    if flow.get("error"):
        _block(result, flow, when, [["one device with the same calls", f"failed: {flow['error']}", "", ""]], limit)
        return [Evidence("cannot_judge", f"cannot judge: one device making the same calls failed ({flow['error']})")]
    found = _calls(flow, limit) + _equals(flow, limit) + _ranks(flow, record.flow_changes)
    whole = flow["changes_numbers"]
    rows = [["the calls, in all", f"moved one device's output by {flow['effect']:.3g}", "changes" if whole else "",
             _verdict(whole, flow["effect"], limit) if whole else ""]]
    equals = flow.get("equals")
    if equals is not None:
        rows.append([f"against {equals['text']}", f"failed: {equals['error']}" if "error" in equals else
                     f"one device differs by {equals['diff']:.3g}", "equals it", "" if "error" in equals else
                     _verdict(False, equals["diff"], limit)])
    changes = flow.get("one_device_changes")
    if changes is not None:
        rows.append(["what the calls changed of the model", f"{len(changes)} changes on one device"
                     + (f", first: {changes[0]}" if changes else ""), "every rank the same",
                     "no" if any(item.check == "flow_calls" for item in found) else "yes"])
    _block(result, flow, when, rows, limit)
    return found


def _block(result, flow: dict, when: str, rows: list[list], limit: float | None) -> None:
    calls = [[f"{index + 1}. {call['text']}", "" if call["moved"] is None else
              f"moved one device's output by {call['moved']:.3g}", call["declared"] or "",
              "" if call["moved"] is None or call["declared"] is None else
              _verdict(call["declared"] == "changes", call["moved"], limit)]
             for index, call in enumerate(flow["calls"])]
    result.extra.setdefault("blocks", []).append(
        table(f"{TITLE} ({when})", ["call", "one device", "declared", "as declared"], calls + rows))


def _verdict(changes: bool, moved: float, limit: float | None) -> str:
    if limit is None:
        return ""
    return "yes" if (moved > limit if changes else moved <= limit) else "no"


def _calls(flow: dict, limit: float | None) -> list[Evidence]:
    if limit is None:
        return []
    found = []
    for index, call in enumerate(flow["calls"]):
        moved, declared = call["moved"], call["declared"]
        if moved is None or declared is None:
            continue
        if declared == "changes" and not moved > limit:
            found.append(Evidence("flow_effect", f"call {index + 1} ({_short(call['text'])}) moved one device's "
                                                 f"output by {moved:.3g}, within the limit {limit:.3g}: it did "
                                                 f"nothing the case could compare", f"call {index + 1}", moved, limit))
        elif declared == "keeps" and not moved <= limit:
            found.append(Evidence("flow_effect", f"call {index + 1} ({_short(call['text'])}) moved one device's "
                                                 f"output by {moved:.3g}, beyond the limit {limit:.3g}, though it must "
                                                 f"keep it", f"call {index + 1}", moved, limit))
    if not found and flow["changes_numbers"] and not flow["effect"] > limit:
        found.append(Evidence("flow_effect", f"the flow's calls moved one device's output by {flow['effect']:.3g}, "
                                             f"within the limit {limit:.3g}: they did not do what the flow declares",
                              value=flow["effect"], limit=limit))
    return found


def _equals(flow: dict, limit: float | None) -> list[Evidence]:
    equals = flow.get("equals")
    if equals is None or limit is None:
        return []
    if "error" in equals:
        return [Evidence("cannot_judge", f"cannot judge: {equals['text']} could not be had on one device "
                                         f"({equals['error']})")]
    if equals["diff"] <= limit:
        return []
    return [Evidence("flow_equals", f"after the calls one device differs from {equals['text']} by "
                                    f"{equals['diff']:.3g} (limit {limit:.3g})", value=equals["diff"], limit=limit)]


def _ranks(flow: dict, per_rank: list | None) -> list[Evidence]:
    one_device = flow.get("one_device_changes")
    if one_device is None or per_rank is None:
        return []
    found = []
    for rank, changes in enumerate(per_rank):
        differs = state.compared(changes or [], one_device)
        if differs is not None:
            found.append(Evidence("flow_calls", f"rank {rank}'s calls changed the model otherwise than one device's: "
                                                f"{differs}", f"rank {rank}"))
    return found


def _short(text: str) -> str:
    return text.split("(", 1)[0] + "(...)" if "(" in text else text
