"""A few steps of flow-matching training, the same on one device and under any layout: the data, the objective, the
loop, and the gradient reductions a correct data- and context-parallel training loop performs.

The objective is the one diffusers' flow-matching training scripts use (examples/dreambooth/train_dreambooth_flux.py
and its siblings): sigmas from a logit-normal density, noisy = (1 - sigma) * latents + sigma * noise, the model
predicts the velocity, target = noise - latents, mean squared error; AdamW. Low precision is mixed precision, as
those scripts train: fp32 weights and optimizer, the forward under autocast in the case's dtype.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

# Fixed so that every layout and every release trains the same way; stored in each train reference.
RECIPE = {"batch": 2, "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 1e-2,
          "logit_mean": 0.0, "logit_std": 1.0}
_DATA_SEED = 7919  # added to the spec's seed for the noise and sigmas (the samples use the spec's own seeds)


@dataclass
class Batch:
    """The global batch of every step, identical for every layout: the data-parallel degree only decides who trains
    on which samples."""

    conditions: dict  # the model inputs besides the noisy latents and the timestep, for the whole batch
    batched: tuple[str, ...]  # keys of `conditions` whose first axis is the sample (the rest every sample shares)
    latents: torch.Tensor  # the clean latents, (batch, ...)
    noise: torch.Tensor  # (steps, batch, ...)
    sigmas: torch.Tensor  # (steps, batch)

    @property
    def size(self) -> int:
        return self.latents.shape[0]

    def part(self, index: int, parts: int) -> Batch:
        """The samples data-parallel rank `index` of `parts` trains on."""
        if self.size % parts:
            from harness.core.errors import HarnessError

            raise HarnessError(f"a batch of {self.size} does not split over {parts} data-parallel ranks")
        start, stop = index * self.size // parts, (index + 1) * self.size // parts
        conditions = {key: value[start:stop] if key in self.batched else value
                      for key, value in self.conditions.items()}
        return replace(self, conditions=conditions, latents=self.latents[start:stop],
                       noise=self.noise[:, start:stop], sigmas=self.sigmas[:, start:stop])

    def to(self, device) -> Batch:
        """On `device`, cloned (tensors mapped from a file can sit at unaligned addresses, which moves results)."""
        def move(value):
            return value.to(device).clone() if isinstance(value, torch.Tensor) else value

        return replace(self, conditions={key: move(value) for key, value in self.conditions.items()},
                       latents=move(self.latents), noise=move(self.noise), sigmas=move(self.sigmas))


def make_batch(spec, shape: str, steps: int) -> Batch:
    """`RECIPE["batch"]` samples of the spec's inputs (sample 0 is the tensor reference's own input), their
    `hidden_states` as the clean latents, and seeded noise and logit-normal sigmas for every step."""
    geometry = spec.shapes[shape]
    samples = [spec.make_inputs(torch.Generator().manual_seed(spec.seed + 1 + index), geometry)
               for index in range(RECIPE["batch"])]
    conditions, batched = stack_samples(samples)
    latents = conditions.pop("hidden_states")
    for key in spec.timestep_keys:
        conditions.pop(key, None)
    generator = torch.Generator().manual_seed(spec.seed + _DATA_SEED)
    noise = torch.randn(steps, *latents.shape, generator=generator)
    logits = torch.randn(steps, latents.shape[0], generator=generator) * RECIPE["logit_std"] + RECIPE["logit_mean"]
    return Batch(conditions, tuple(sorted(set(batched) & set(conditions))), latents, noise, torch.sigmoid(logits))


def stack_samples(samples: list[dict]) -> tuple[dict, list[str]]:
    """One batch from single-sample inputs: tensors whose first axis is 1 and one-item lists are concatenated along
    the sample; everything else (position ids, sizes) must be the same for every sample, or the spec cannot batch."""
    from harness.core.errors import HarnessError

    stacked, batched = {}, []
    for key, first in samples[0].items():
        values = [sample[key] for sample in samples]
        if isinstance(first, torch.Tensor) and first.dim() > 0 and first.shape[0] == 1:
            stacked[key], _ = torch.cat(values), batched.append(key)
        elif isinstance(first, list) and len(first) == 1:
            stacked[key], _ = [item for value in values for item in value], batched.append(key)
        elif all(_same(first, value) for value in values[1:]):
            stacked[key] = first
        else:
            raise HarnessError(f"input {key!r} differs between samples but has no sample axis: cannot batch it")
    return stacked, batched


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and bool((a == b).all())
    return a == b


def flow_matching_loss(model, batch: Batch, step: int, timestep_scale: float, timestep_keys, autocast) -> torch.Tensor:
    """The mean squared error between the predicted and the true velocity on `batch` at `step`."""
    sigmas = batch.sigmas[step]
    latents, noise = batch.latents, batch.noise[step]
    expand = sigmas.reshape(-1, *([1] * (latents.dim() - 1)))
    noisy = (1 - expand) * latents + expand * noise
    timestep = {key: sigmas * timestep_scale for key in timestep_keys}
    with autocast:
        prediction = model(hidden_states=noisy, **timestep, **batch.conditions, return_dict=False)[0]
    return torch.nn.functional.mse_loss(prediction.float(), (noise - latents).float())


@dataclass
class Groups:
    """The process groups gradients are reduced over (None: that dimension is absent)."""

    data: object = None
    data_size: int = 1
    context: object = None
    context_size: int = 1
    parallel: bool = False  # run under a layout: the ranks must end with the same plain parameters
    # PyTorch's context parallelism: each rank's loss is over its own chunk of the sequence (diffusers' is over the
    # gathered output), so the gradients and the loss are averaged over the context-parallel ranks, not summed
    context_mean: bool = False

    @classmethod
    def of(cls, layout, mesh) -> Groups:
        if mesh is None:
            return cls()
        groups = cls(parallel=True)
        if layout.dp > 1:
            groups.data, groups.data_size = mesh["dp"].get_group(), layout.dp
        if layout.is_torch_context_parallel:
            groups.context, groups.context_size = mesh["cp"].get_group(), layout.torch_cp
            groups.context_mean = True
        if layout.is_context_parallel:
            cp = mesh["ring", "ulysses"]._flatten("cp") if layout.ring > 1 and layout.ulysses > 1 \
                else mesh["ring" if layout.ring > 1 else "ulysses"]
            groups.context, groups.context_size = cp.get_group(), layout.ring * layout.ulysses
        return groups


def reduce_context_parallel(named: dict, groups: Groups) -> None:
    """Sum every gradient over the context-parallel ranks. diffusers gathers the output at the end of the
    context-parallel region with an all-gather whose backward hands each rank the gradient of its own chunk only
    (`AllGatherFunction.backward` in hooks/context_parallel.py), so each rank's parameter gradients hold its chunk's
    share of the full loss that every rank computes on the gathered output: the full gradient is their sum.

    Under PyTorch's context parallelism each rank's loss is the mean over its own chunk, and its ring's backward
    hands every rank the gradient of all ranks' losses through its chunk's keys and values: the sum over the ranks
    is the gradient of the sum of their losses, and the full loss is their mean (`context_mean`)."""
    if groups.context is None:
        return
    for parameter in named.values():
        if parameter.grad is not None:
            dist.all_reduce(_local(parameter.grad), op=dist.ReduceOp.SUM, group=groups.context)
            if groups.context_mean:
                _local(parameter.grad).div_(groups.context_size)


def data_parallel_sync(module) -> contextlib.AbstractContextManager:
    """The data-parallel engine reduces (averages) the gradients in backward; this is where that is switched on."""
    return contextlib.nullcontext()


def global_loss(loss: torch.Tensor, groups: Groups) -> float:
    """The loss of the whole batch: the mean of the data-parallel ranks' losses (each over its equal share), and of
    the context-parallel ranks' where each holds its chunk's loss (PyTorch's context parallelism)."""
    value = loss.detach().clone()
    if groups.context_mean:
        dist.all_reduce(value, op=dist.ReduceOp.SUM, group=groups.context)
        value /= groups.context_size
    if groups.data is not None:
        dist.all_reduce(value, op=dist.ReduceOp.SUM, group=groups.data)
        value /= groups.data_size
    return float(value)


def sequence_buffers(batch: Batch, seq_dims: dict[str, int]) -> dict:
    """What PyTorch's `context_parallel` shards of a batch (harness.rank.torch_cp): the clean latents and every
    step's noise where the spec names `hidden_states` (the noise one axis later, behind its step axis), and the
    conditions it names, each the very tensor the loop uses."""
    found = {}
    if "hidden_states" in seq_dims:
        dim = seq_dims["hidden_states"]
        found = {"latents": (batch.latents, dim), "noise": (batch.noise, dim + 1)}
    found.update({name: (batch.conditions[name], dim) for name, dim in seq_dims.items() if name != "hidden_states"})
    return found


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def full(tensor: torch.Tensor, packed: tuple | None = None) -> torch.Tensor:
    """A parameter or gradient as a whole fp32 CPU tensor: a sharded DTensor (TP, FSDP) is gathered to full, and a
    packed one (`packed`: dim, block sizes, degree) put back in the model's own order."""
    if hasattr(tensor, "full_tensor"):
        tensor = tensor.full_tensor()
    tensor = tensor.detach().float().cpu()
    return unpack(tensor, *packed) if packed is not None else tensor.clone()


def packed_parameters(module, degree: int) -> dict[str, tuple]:
    """{name: (dim, block sizes, degree)} of the parameters diffusers shards block by block (PackedColwiseParallel,
    PackedRowwiseParallel: a fused projection such as Flux's single-block `proj_out`, whose input is
    cat(attention, MLP)). Each rank's local tensor is its slice of every block, concatenated, yet the DTensor says a
    plain `Shard(dim)`: `full_tensor()` returns the blocks' slices in rank order, not the model's order."""
    try:
        from diffusers.hooks.tensor_parallel import resolve_tp_shard_specs
    except ImportError:
        return _packed_from_plan(module, degree)
    specs = resolve_tp_shard_specs(module, type(module)._tp_plan, degree)
    return {name: (spec.dim, list(spec.block_sizes), degree) for name, spec in specs.items()
            if spec.block_sizes is not None and len(spec.block_sizes) > 1}


def _packed_from_plan(module, degree: int) -> dict[str, tuple]:
    """The same, on a release with the packed styles but without `resolve_tp_shard_specs` (0.40.0): read from the
    plan's markers through diffusers' own plan expansion and block arithmetic (without it, a packed gradient is
    compared in rank order: flux's `proj_out` came out 1.05 rel L2 off). Before 0.40 there is no tensor parallelism."""
    try:
        from diffusers.hooks.tensor_parallel import (
            PackedColwiseParallel,
            PackedRowwiseParallel,
            _blocks_to_block_sizes,
            _resolve_tp_plan,
        )
    except ImportError:
        return {}
    names = {id(child): name for name, child in module.named_modules()}
    found = {}
    for block, plan in _resolve_tp_plan(module, type(module)._tp_plan):
        for relative, style in plan.items():
            if not isinstance(style, (PackedColwiseParallel, PackedRowwiseParallel)):
                continue
            linear, columns = block.get_submodule(relative), isinstance(style, PackedColwiseParallel)
            blocks = style.blocks or getattr(linear, "_tp_packed_col_blocks" if columns else "_tp_packed_row_blocks")
            dim = 0 if columns else 1
            sizes = _blocks_to_block_sizes(linear.weight.shape[dim], blocks)
            if len(sizes) < 2:
                continue
            path = ".".join(part for part in (names[id(block)], relative) if part)
            found[f"{path}.weight"] = (dim, sizes, degree)
            if columns and linear.bias is not None:  # a row-parallel bias is added after the reduction: whole
                found[f"{path}.bias"] = (0, sizes, degree)
    return found


def unpack(gathered: torch.Tensor, dim: int, block_sizes: list[int], degree: int) -> torch.Tensor:
    """The model's order from the rank-order concatenation of block-sharded local tensors."""
    local = gathered.shape[dim] // degree
    pieces = [torch.split(gathered.narrow(dim, rank * local, local), [size // degree for size in block_sizes], dim)
              for rank in range(degree)]
    return torch.cat([pieces[rank][block] for block in range(len(block_sizes)) for rank in range(degree)], dim)


def data_parallel_engine() -> str:
    """FSDP2 (`fully_shard`) where this torch has it, DDP otherwise."""
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return "ddp"
    return "fsdp2"


def wrap_data_parallel(module, mesh, engine: str):
    """The module as the data-parallel engine trains it over the `dp` mesh dimension."""
    if engine == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        return fully_shard(module, mesh=mesh["dp"])
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(module, process_group=mesh["dp"].get_group())


class Trainer:
    """K AdamW steps from the seed weights; each `run()` starts again from them, so a case can be run twice (the case,
    its localization) and give the same numbers. `module` holds the parameters; `model` is what is called (the
    data-parallel wrapper where there is one)."""

    def __init__(self, model, module, batch: Batch, steps: int, spec, dtype: torch.dtype | None, device,
                 groups: Groups, packed: dict | None = None, microbatches: int = 1):
        self.model, self.module, self.batch, self.steps, self.spec = model, module, batch, steps, spec
        self.groups, self.packed, self.microbatches = groups, packed or {}, microbatches
        self.autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype is not None \
            else contextlib.nullcontext
        self.named = dict(module.named_parameters())
        self.initial = {name: parameter.detach().clone() for name, parameter in self.named.items()}

    def restart(self) -> None:
        with torch.no_grad():
            for name, parameter in self.named.items():
                parameter.copy_(self.initial[name])
                parameter.grad = None

    def first_forward(self) -> torch.Tensor:
        """Step 1's loss from the seed weights, forward only (what localization traces)."""
        self.restart()
        return flow_matching_loss(self.model, self.batch, 0, self.spec.timestep_scale, self.spec.timestep_keys,
                                  self.autocast())

    def loss(self, step: int) -> torch.Tensor:
        """The batch's loss at `step`: the mean of its micro-batches' (each an equal share of the samples)."""
        parts = [self.batch.part(index, self.microbatches) for index in range(self.microbatches)] \
            if self.microbatches > 1 else [self.batch]
        losses = [flow_matching_loss(self.model, part, step, self.spec.timestep_scale, self.spec.timestep_keys,
                                     self.autocast()) for part in parts]
        return sum(losses) / len(losses) if len(losses) > 1 else losses[0]

    def run(self, recording=None) -> dict:
        """The K steps, with `recording` (a context manager) around step 1's forward and backward if given."""
        self.restart()
        optimizer = torch.optim.AdamW(self.named.values(), lr=RECIPE["lr"], betas=tuple(RECIPE["betas"]),
                                      eps=RECIPE["eps"], weight_decay=RECIPE["weight_decay"], foreach=False)
        losses, gradients = [], {}
        self.module.train()
        for step in range(self.steps):
            optimizer.zero_grad(set_to_none=True)
            with data_parallel_sync(self.model), (recording if step == 0 and recording is not None
                                                   else contextlib.nullcontext()):
                loss = self.loss(step)
                loss.backward()
            reduce_context_parallel(self.named, self.groups)
            if step == 0:
                gradients = {name: full(p.grad, self.packed.get(name)) for name, p in self.named.items()
                             if p.grad is not None}
            optimizer.step()
            losses.append(global_loss(loss, self.groups))
        weights = {name: full(parameter, self.packed.get(name)) for name, parameter in self.named.items()}
        plain = [name for name, parameter in self.named.items() if not hasattr(parameter, "full_tensor")]
        losses = torch.tensor(losses, dtype=torch.float64)
        return {"losses": losses, "gradients": gradients, "weights": weights,
                "disagreement": disagreement(plain, gradients, weights, next(iter(self.named.values())).device,
                                             losses) if self.groups.parallel else {}}


def disagreement(names: list[str], gradients: dict, weights: dict, device, losses: torch.Tensor) -> dict[str, float]:
    """How far the ranks are apart on the losses and on each plain (non-DTensor) parameter, which each rank holds
    whole: its step-1 gradient and its final weights, as the largest max-minus-min over ranks (only those that differ
    at all; the losses as `loss`). A DTensor is one value by construction once gathered, so this covers everything
    a rank ends with: a loss or a plain parameter the ranks disagree on is a bug of the layout."""
    pieces = [("loss", losses)]
    pieces += [(name, tensor) for name in names for tensor in (gradients.get(name), weights[name])
               if tensor is not None]
    flat = torch.cat([tensor.flatten().double() for _, tensor in pieces]).to(device)
    high, low = flat.clone(), flat.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    spread, found, start = (high - low).cpu(), {}, 0
    for name, tensor in pieces:
        width = float(spread[start:start + tensor.numel()].max()) if tensor.numel() else 0.0
        start += tensor.numel()
        if width > 0:
            found[name] = max(found.get(name, 0.0), width)
    return found
