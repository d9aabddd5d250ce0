"""Faults in how a parallel model is loaded (`from_pretrained(..., parallel_config=...)`, the `pretrained` loads):
a sharded loader that reads another rank's slice, and a config whose context-parallel part is dropped."""

from __future__ import annotations

from harness.faults.patching import patched
from harness.faults.registry import fault


@fault("loading: the sharded from_pretrained reads the next rank's slice of the first weight it shards (each rank "
       "holds another rank's shard of it)")
def load_wrong_slice():
    """diffusers' streaming tensor-parallel loader slices each planned weight with `_local_shard` (looked up at each
    call): its first call of a load gets the next rank's slice."""
    from diffusers.hooks import tensor_parallel

    original, calls = tensor_parallel._local_shard, []

    class _NextRank:
        def __init__(self, mesh):
            self.mesh = mesh

        def get_local_rank(self):
            return (self.mesh.get_local_rank() + 1) % self.mesh.size()

        def size(self):
            return self.mesh.size()

    def local_shard(tensor, dim, block_sizes, tp_mesh):
        calls.append(dim)
        return original(tensor, dim, block_sizes, _NextRank(tp_mesh) if len(calls) == 1 else tp_mesh)

    return patched(tensor_parallel, "_local_shard", local_shard)


@fault("loading: from_pretrained installs only the tensor-parallel part of its parallel_config, as reported upstream "
       "for CP x TP configs: the context-parallel hooks are never installed and every rank computes the whole "
       "sequence")
def load_cp_hooks_dropped():
    """`enable_parallelism`, which from_pretrained calls with its parallel_config, resolves the config (mesh and
    all) and applies only its tensor-parallel part, as the upstream report says from_pretrained does with a CP x TP
    config: no context-parallel hook, no processor that knows the config."""
    from diffusers import ModelMixin

    def tensor_parallel_only(self, *, config, cp_plan=None):
        resolve = getattr(self, "_resolve_parallel_config", None)  # 0.41+; before, the config stays unresolved
        resolved = resolve(config) if resolve is not None else config
        if getattr(resolved, "tensor_parallel_config", None) is not None:
            from diffusers.hooks.tensor_parallel import apply_tensor_parallel

            apply_tensor_parallel(self, resolved.tensor_parallel_config, self._tp_plan)

    return patched(ModelMixin, "enable_parallelism", tensor_parallel_only)
