"""Flows of diffusers' caches (`model.enable_cache(config)`, its caching guide): each decides per denoising step
whether to compute or to reuse, so a cache's case runs a short denoising loop (harness.flows.denoising) and every
rank's decision at every step is recorded and compared.

Each config is set so that one device really reuses at some step of the loop on the tiny zoo (flux and qwenimage:
fewer `nn.Linear` calls at that step than at the first); a cache that reuses nothing there tests nothing, and its
case says so (`cache_reuse`). A tensor case runs the harness's loop (harness.flows.denoising); a picture runs the
pipeline's own, with its own `cache_context` calls (harness.flows.pipeline_loop).
"""

from __future__ import annotations

from harness.flows.registry import AFTER, BEFORE, Call, Equivalent, Refused, flow

STEPS = 5  # the loop's steps: room for a warm-up, reuses and full steps between them
DISTILLED = True  # FasterCache is told each call is one branch: the loop calls the branches apart, each in its context
# A pipeline opens a cache context per branch of guidance (`cond`, `uncond`) so that a cache keeps a state for each: the
# same loop with a model of its own per branch is what the cached loop must equal (on a loop of one branch, itself)
PER_BRANCH = Equivalent("the same cache on a model of its own for each branch (cond, uncond): no state shared",
                        per_context=True)


# First Block Cache, MagCache and SeaCache read each block's inputs and outputs from diffusers' registry of block
# classes; a model whose block is not registered is refused with a clear error, on one device as on any layout
UNREGISTERED = tuple(Refused(position, "all", "not registered", "diffusers.hooks._helpers",
                             "TransformerBlockRegistry.get, from enable_cache") for position in (BEFORE, AFTER))
# TaylorSeer's attention modules: diffusers' defaults (`_TRANSFORMER_BLOCK_IDENTIFIERS`, matched in full) end at `attn`,
# so Wan's, LTX's, Helios' and ChronoEdit's `attn1`/`attn2` get no hook and the cache silently does nothing there
# (docs/findings.md); the same patterns with the digit, so that the flow tests the cache on every model
ATTENTIONS = [r"^blocks.*attn\d*", r"^transformer_blocks.*attn\d*", r"^single_transformer_blocks.*attn\d*",
              r"^temporal_transformer_blocks.*attn\d*"]


def _threshold(setting) -> float:
    """First Block Cache's and SeaCache's threshold on the relative change they gate on: a pipeline's own loop (a
    picture) moves its latents further per step than the harness's loop (its scheduler's shifted sigmas), and 0.5
    reused at no step of QwenImage's picture (FBC) or Wan's (SeaCache); 1.0 reuses at some steps of each."""
    return 0.5 if setting.pipeline is None else 1.0


def _cache(hooks_module: str) -> dict:
    """What every cache flow declares: the diffusers module of its cache (a release without it: SKIP), the model's
    `enable_cache` and the loop its case runs. Its one call declares no effect on the numbers: the loop's one-device
    output is far from the captured single forward whatever the cache does; what proves the cache acted is a step
    that computed less (`cache_reuse`, harness.run.decisions)."""
    return {"needs": (f"diffusers.hooks.{hooks_module}",), "needs_api": ("enable_cache",), "steps": STEPS,
            "equals": PER_BRANCH, "kinds": ("tensor", "image")}


def _registered(hooks_module: str) -> dict:
    """A cache of the block registry's (First Block Cache, MagCache, SeaCache): refused on a block it has not."""
    return {**_cache(hooks_module), "refused": UNREGISTERED}


# Each rank decides on its own chunk under context parallelism and the ranks deadlock (a TIMEOUT after the case's
# time limit, which no entry excuses): the quick plan runs it in neither position (docs/flows.md)
@flow(Call("model.enable_cache(FirstBlockCacheConfig(threshold=0.5 (a picture: 1.0))): the remaining blocks reused "
           "while the first block's residual changes by less than the threshold"), **_registered("first_block_cache"),
      quick=())
def cache_fbc(module, setting):
    from diffusers.hooks import FirstBlockCacheConfig

    module.enable_cache(FirstBlockCacheConfig(threshold=_threshold(setting)))


@flow(Call("model.enable_cache(PyramidAttentionBroadcastConfig(spatial_attention_block_skip_range=2, "
           "spatial_attention_timestep_skip_range=(100, 800), current_timestep_callback=<the loop's timestep>))"),
      **_cache("pyramid_attention_broadcast"))
def cache_pab(module, setting):
    from diffusers.hooks import PyramidAttentionBroadcastConfig

    module.enable_cache(PyramidAttentionBroadcastConfig(
        spatial_attention_block_skip_range=2, spatial_attention_timestep_skip_range=(100, 800),
        current_timestep_callback=setting.denoising.current_timestep))


@flow(Call("model.enable_cache(FasterCacheConfig(spatial_attention_block_skip_range=2, "
           "spatial_attention_timestep_skip_range=(-1, 700), is_guidance_distilled=True, "
           "current_timestep_callback=<the loop's timestep>, attention_weight_callback=lambda _: 0.5))"),
      **_cache("faster_cache"))
def cache_faster(module, setting):
    from diffusers.hooks import FasterCacheConfig

    # Two steps above 700 compute first: FasterCache extrapolates from the two outputs before the one it skips
    module.enable_cache(FasterCacheConfig(
        spatial_attention_block_skip_range=2, spatial_attention_timestep_skip_range=(-1, 700),
        is_guidance_distilled=DISTILLED, current_timestep_callback=setting.denoising.current_timestep,
        attention_weight_callback=lambda _: 0.5))


@flow(Call("model.enable_cache(TaylorSeerCacheConfig(cache_interval=2, disable_cache_before_step=1, max_order=1, "
           "taylor_factors_dtype=<the case's dtype>, cache_identifiers=<every block's attention, attn1 and attn2 "
           "too>))"), **_cache("taylorseer_cache"), quick_compiled=True)
def cache_taylorseer(module, setting):
    from diffusers.hooks import TaylorSeerCacheConfig

    module.enable_cache(TaylorSeerCacheConfig(cache_interval=2, disable_cache_before_step=1, max_order=1,
                                              taylor_factors_dtype=setting.dtype, cache_identifiers=ATTENTIONS))


@flow(Call("model.enable_cache(MagCacheConfig(threshold=0.5, max_skip_steps=2, num_inference_steps=<the loop's "
           "steps>, mag_ratios=[1.0] * steps)): flat magnitude ratios, as calibrating a model whose residuals barely "
           "change gives"), **_registered("mag_cache"))
def cache_mag(module, setting):
    from diffusers.hooks import MagCacheConfig

    steps = setting.denoising.steps
    module.enable_cache(MagCacheConfig(threshold=0.5, max_skip_steps=2, num_inference_steps=steps,
                                       mag_ratios=[1.0] * steps))


@flow(Call("model.enable_cache(SeaCacheConfig(threshold=0.5 (a picture: 1.0), raw_vision_callback=<the packed "
           "latents as one frame>)), the loop's cache_context carrying step_index, sigma and num_inference_steps"),
      **_registered("sea_cache"))
def cache_sea(module, setting):
    from diffusers.hooks import SeaCacheConfig

    module.enable_cache(SeaCacheConfig(threshold=_threshold(setting), raw_vision_callback=_packed_latents))


def _packed_latents(module, args, kwargs) -> list:
    """SeaCache's adapter for a model it has none for (its own are Wan's and Cosmos 3's; without one it never reuses):
    the visual latents as (C, T, H, W), here the packed tokens of the one picture as a frame of one column."""
    return [kwargs["hidden_states"][0].transpose(0, 1).unsqueeze(1).unsqueeze(-1)]
