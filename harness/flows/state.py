"""What a flow's calls changed of a model, in words any process can compare: per module its class, its attention
processor (replaced or not, and its backend set or not), the hooks diffusers registered on it (and accelerate's),
whether it is compiled, its own parameters (added, removed, cast, frozen, their values changed) and PEFT's adapter
scales and merges.

Taken before and after the calls, on every rank and on one device: a rank whose calls changed other things than one
device's did not make the same calls (a user's `if rank == 0:` around one), even where the numbers cannot show it
(a processor set anew, an offload, a fusion: calls that keep the numbers). What only parallelism puts on a model
(its config, its sharded placements) is left out, so one device compares with every rank; values are hashed in
each process's own shard, so "changed" means the same on both.
"""

from __future__ import annotations

import hashlib

Snapshot = dict[str, dict]


def snapshot(model) -> Snapshot:
    """Each module's state that a user's call can change, by its name in `model`."""
    return {name: _module_state(module) for name, module in model.named_modules()}


def _module_state(module) -> dict:
    processor = getattr(module, "processor", None)
    registry = getattr(module, "_diffusers_hook", None)
    state = {
        "class": type(module).__name__,
        # the processor itself, not its id(): held here, it cannot be freed and its address reused by the next one
        # (a processor replaced twice would read as the same one)
        "processor": None if processor is None else (processor, type(processor).__name__,
                                                     getattr(processor, "_attention_backend", None) is not None),
        "hooks": tuple(sorted(registry.hooks)) if registry is not None else (),
        "accelerate": "_hf_hook" in vars(module),
        "compiled": getattr(module, "_compiled_call_impl", None) is not None,  # nn.Module.compile's own attribute
        "parameters": {name: (str(value.dtype).removeprefix("torch."), value.requires_grad, _digest(value))
                       for name, value in module.named_parameters(recurse=False)},
    }
    scaling, merged = getattr(module, "scaling", None), getattr(module, "merged_adapters", None)
    if isinstance(scaling, dict):  # PEFT's LoRA layer: the scale of each adapter (set_adapters' weights)
        state["scaling"] = tuple(sorted((str(key), float(value)) for key, value in scaling.items()))
    if isinstance(merged, list):  # ...and the adapters fused into its weight
        state["merged"] = tuple(sorted(map(str, merged)))
    return state


def _digest(value) -> str:
    """The parameter's values on this process (a DTensor's local shard), hashed: equal or not, nothing more."""
    import torch

    local = value.to_local() if hasattr(value, "to_local") else value
    if local.device.type == "meta":
        return "meta"
    data = local.detach().to("cpu").contiguous().view(-1).view(torch.uint8)
    return hashlib.blake2b(data.numpy().tobytes(), digest_size=8).hexdigest()


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    """What differs from `before` to `after`, one line per module and kind of change, in module order."""
    found = []
    for name in [*before, *(name for name in after if name not in before)]:
        label = name or "<model>"
        if name not in after:
            found.append(f"{label}: removed ({before[name]['class']})")
        elif name not in before:
            found.append(f"{label}: added ({after[name]['class']})")
        else:
            found += [f"{label}: {line}" for line in _module_changes(before[name], after[name])]
    return found


def _module_changes(old: dict, new: dict) -> list[str]:
    lines = []
    if old["class"] != new["class"]:
        lines.append(f"{old['class']} became {new['class']}")
    if old["processor"] != new["processor"]:
        lines.append(_processor_change(old["processor"], new["processor"]))
    added, removed = set(new["hooks"]) - set(old["hooks"]), set(old["hooks"]) - set(new["hooks"])
    lines += [f"hook {hook} added" for hook in sorted(added)] + [f"hook {hook} removed" for hook in sorted(removed)]
    if old["accelerate"] != new["accelerate"]:
        lines.append("accelerate hook " + ("added" if new["accelerate"] else "removed"))
    if old["compiled"] != new["compiled"]:
        lines.append("compiled (torch.compile)" if new["compiled"] else "no longer compiled")
    lines += _parameter_changes(old["parameters"], new["parameters"])
    for key, what in (("scaling", "adapter scales"), ("merged", "merged adapters")):
        if old.get(key) != new.get(key):
            lines.append(f"{what} {old.get(key, ())} became {new.get(key, ())}")
    return lines


def _processor_change(old, new) -> str:
    if old is None or new is None:
        return "processor " + ("added" if old is None else "removed")
    if old[0] is not new[0]:
        return f"processor replaced ({old[1]} by {new[1]})"
    return "attention backend " + ("set" if new[2] else "cleared")


def _parameter_changes(old: dict, new: dict) -> list[str]:
    lines = [f"parameter {name} added" for name in new if name not in old]
    lines += [f"parameter {name} removed" for name in old if name not in new]
    for name in (name for name in old if name in new):
        (dtype, trains, digest), (new_dtype, new_trains, new_digest) = old[name], new[name]
        if dtype != new_dtype:
            lines.append(f"parameter {name} cast from {dtype} to {new_dtype}")
        elif digest != new_digest:
            lines.append(f"parameter {name} changed")
        if trains != new_trains:
            lines.append(f"parameter {name} " + ("unfrozen" if new_trains else "frozen"))
    return lines


def compared(rank: list[str], one_device: list[str]) -> str | None:
    """How a rank's changes differ from one device's, in a line (None: the same)."""
    if rank == one_device:
        return None
    missing = [line for line in one_device if line not in set(rank)]
    extra = [line for line in rank if line not in set(one_device)]
    parts = []
    if missing:
        parts.append(f"{len(missing)} of one device's {len(one_device)} changes missing, first: {missing[0]}")
    if extra:
        parts.append(f"{len(extra)} not made on one device, first: {extra[0]}")
    return "; ".join(parts) or "the same changes in another order"
