"""A synthetic run of the full plan's size and shape, as results.json records, for benchmarks/bench_report.py and the
report's size tests.

22,800 cases like the real full plan's: tensor, image and train kinds over 11 models, 13 layouts (16 for train),
10 backends and 3 dtypes; 17,028 SKIP over 39 reasons (the real plan's count, kind by kind), about 3,700 XFAIL over
15 known issues (those that raise carry one of 56 tracebacks, those that are silently wrong carry their figures,
their failed checks (up to 150 for a train case) and their detail blocks), about 2,000 PASS with the figures,
blocks and extras a real case has (the real kinds' figure specs, harness.core.figures' block constructors). The real
full plan had 1,812 PASS and 3,960 XFAIL. Deterministic from a seed.
"""

from __future__ import annotations

import random
import re

from harness.core import figures
from harness.core.results import CaseResult, Status
from harness.kinds import KINDS

# model: (transformer class, tensor shapes, has an image pipeline, has a _cp_plan, has a _tp_plan, train shapes)
MODELS = {
    "flux": ("FluxTransformer2DModel", ("default", "txt7", "img15"), True, True, True, ("default",)),
    "flux2": ("Flux2Transformer2DModel", ("default", "txt7", "img15"), True, True, True, ("default",)),
    "qwenimage": ("QwenImageTransformer2DModel", ("default", "txt7", "img15", "masked"), True, True, True,
                  ("default", "masked")),
    "qwenimage21": ("QwenImage21Transformer2DModel", ("default", "txt7", "img24", "masked"), False, False, True,
                    ("default", "masked")),
    "wan": ("WanTransformer3DModel", ("default", "txt7", "img15", "ti2v"), True, True, False, ("default",)),
    "ltx": ("LTXVideoTransformer3DModel", ("default", "txt7", "img15", "masked"), False, True, False,
            ("default", "masked")),
    "ltx2": ("LTX2VideoTransformer3DModel", ("default", "txt7", "img15", "masked", "isolated"), False, True, False,
             ("default", "masked")),
    "helios": ("HeliosTransformer3DModel", ("default", "txt7", "img15"), False, True, False, ("default",)),
    "helios_amplify": ("HeliosTransformer3DModel", ("default",), False, True, False, ("default",)),
    "minimax_h3": ("MiniMaxH3Transformer3DModel", ("default", "txt7", "img15"), False, True, False, ("default",)),
    "chronoedit": ("ChronoEditTransformer3DModel", ("default", "img45"), False, True, False, ("default",)),
}
LAYOUTS = {"single": 1, "ulysses2": 2, "ring2": 2, "ulysses4": 4, "ring4": 4, "ring2xulysses2": 4, "tp2": 2,
           "tp4": 4, "ulysses2any": 2, "ring2any": 2, "ulysses4any": 4, "tp2+ulysses2": 4, "tp2+ring2": 4}
TRAIN_LAYOUTS = {**LAYOUTS, "dp2": 2, "dp2xulysses2": 4, "dp2xring2": 4}
CPU_BACKENDS = ("native", "_native_math", "_native_flash", "flex")
GPU_BACKENDS = {
    "_native_cudnn": "needs CUDA: RuntimeError: No viable backend for scaled_dot_product_attention was found.",
    "_native_efficient": "needs CUDA: memory-efficient attention has no CPU kernel",
    "flash": "RuntimeError: Flash Attention backend 'flash' is not usable because of missing package or the version "
             "is too old. Please install `flash-attn>=2.6.3`.",
    "_flash_3": "RuntimeError: Flash Attention 3 backend '_flash_3' is not usable because of missing package or the "
                "version is too old. Please build FA3 beta release from source.",
    "sage": "RuntimeError: Sage Attention backend 'sage' is not usable because of missing package or the version is "
            "too old. Please install `sageattention>=2.1.1`.",
    "xformers": "RuntimeError: Xformers Attention backend 'xformers' is not usable because of missing package or the "
                "version is too old. Please install `xformers>=0.0.29`.",
}
DTYPES = ("fp32", "bf16", "fp16")
URL = " (https://github.com/huggingface/diffusers/blob/v0.42.1/src/diffusers/models/attention_dispatch.py)"
RAISING = {  # known issues whose cases raise: (reason, the error), matched in this order
    "lse": ("native SDPA cannot return the log-sum-exp that ring attention merges with; use _native_flash or "
            "_native_cudnn for ring", "ValueError: Native attention does not support return_lse=True"),
    "uneven": ("plain Ulysses/ring shard every sequence evenly: a text or image length not divisible by the degree "
               "is refused (ulyssesNany / ringNany are diffusers' answer)",
               "AssertionError: Tensor size along dimension to be sharded must be divisible by mesh size"),
    "gloo": ("ulysses_anything / ring_anything gather uneven output shards with all_gather, which gloo refuses for "
             "unequal sizes (CPU only; NCCL accepts them)", "RuntimeError: All tensor operands to scatter/gather "
             "must have the same number of elements"),
    "mask": ("_native_flash refuses any attention mask (padded prompts; QwenImage-2.1's causal text-segment masks)",
             "ValueError: `attn_mask` is not supported for flash attention."),
    "tp_cp": ("diffusers 0.42.1 ParallelConfig refuses a context_parallel_config together with a "
              "tensor_parallel_config", "ValueError: Tensor parallelism and context parallelism cannot be combined"),
    "audio": ("LTX2 audio-to-video cross-attention under context parallelism: its RoPE is not split with the "
              "sequence (isolate_modalities=True works)", "RuntimeError: The size of tensor a (16) must match the "
              "size of tensor b (8) at non-singleton dimension 2"),
    "fp16": ("fp16 under context parallelism on CPU: gloo reduces half-precision tensors through fp32 copies that "
             "torch's CPU collectives refuse", "RuntimeError: Invalid scalar type for gloo all_to_all: Half"),
    "ltx_mask": ("LTX/LTX2 with an encoder attention mask under Ulysses: the mask is not resharded with the heads",
                 "RuntimeError: The expanded size of the tensor (8) must match the existing size (16) at "
                 "non-singleton dimension 3."),
    "chrono": ("ChronoEdit's temporal reasoning frames break Ulysses head sharding", "RuntimeError: shape "
               "'[1, 2, 24, 64]' is invalid for input of size 2304"),
    "mixed": ("mixed-precision training under context parallelism: the context-parallel backward ops recompute "
              "attention outside autocast on saved tensors of mixed dtypes", "RuntimeError: Expected query, key, "
              "and value to have the same dtype, but got query.dtype: float key.dtype: float and value.dtype: "
              "c10::BFloat16 instead."),
}
SILENT = {  # known issues whose cases run and are wrong: (reason, the checks that fail)
    "helios": ("Helios with is_amplify_history=True is silently wrong under context parallelism: HeliosAttnProcessor "
               "takes the history length as the rank's local sequence length minus the full-sequence "
               "original_context_length, so history keys are scaled on the wrong tokens", ("max_abs",)),
    "ring4": ("SILENTLY WRONG GRADIENTS: ring attention's backward (TemplatedRingAttention.backward) sends each "
              "key/value gradient accumulator to rank+1 while step i of the loop works on key/value chunk rank+i: "
              "from degree 3 on, key/value gradients land on the wrong chunks (flux ring4: every parameter's gradient "
              "off by up to 100%, loss after 3 AdamW steps off by 4e-4; the forward is right)", ("loss_rel",
              "grad_rel", "weight_abs")),
    "tp": ("SILENTLY WRONG GRADIENTS under tensor parallelism: the per-head RMSNorm weights (attn.norm_q, norm_k, "
           "norm_added_q, norm_added_k) act on the heads of the column-parallel to_q/to_k, yet the _tp_plan leaves "
           "them plain, so nothing sums their gradients over the tensor-parallel ranks", ("ranks_disagree",
           "grad_rel")),
    "wan": ("Wan TI2V's per-token timesteps are not sharded with the sequence under ring attention", ("max_abs",)),
    "helios_train": ("gradients of every parameter outside Helios' split regions come out C times too large under a "
                     "loop that sums gradients over the context-parallel ranks", ("grad_rel", "weight_abs")),
}
CONTEXT = ("ulysses", "ring")
PARAMS = [f"{block}.{i}.{part}" for block in ("transformer_blocks", "single_transformer_blocks") for i in range(2)
          for part in ("attn.to_q.weight", "attn.to_k.weight", "attn.to_v.weight", "attn.to_k.bias",
                       "attn.norm_q.weight", "attn.norm_k.weight", "attn.add_k_proj.weight", "attn.to_out.0.weight",
                       "ff.net.0.proj.weight", "ff.net.2.weight", "norm1.linear.weight", "ff_context.net.0.proj.weight",
                       "attn.norm_added_q.weight", "attn.norm_added_k.weight", "proj_mlp.weight", "proj_out.weight",
                       "attn.add_v_proj.weight", "norm1_context.linear.weight", "attn.to_add_out.weight")]


def plan() -> list[CaseResult]:
    """Every case, in the plan's order, without a verdict."""
    cases = []
    for model, (_, shapes, image, _, _, train_shapes) in MODELS.items():
        rows = [(shape, "tensor", LAYOUTS) for shape in shapes] + ([("default", "image", LAYOUTS)] if image else [])
        rows += [(shape, "train", TRAIN_LAYOUTS) for shape in train_shapes]
        for shape, kind, layouts in rows:
            for layout, world_size in layouts.items():
                for backend in (*CPU_BACKENDS, *GPU_BACKENDS):
                    for dtype in DTYPES:
                        name = model if shape == "default" else f"{model}@{shape}"
                        cases.append(CaseResult(f"{name}/{layout}/{backend}/{dtype}/{kind}", model, shape, kind,
                                                layout, world_size, backend, dtype, Status.PASS))
    return cases


def skip_reason(case: CaseResult) -> str | None:
    """The plan-time SKIPs: backends needing CUDA, models without a cp/tp plan or a training recipe, backends and
    and layouts without a backward."""
    class_name, _, _, has_cp, has_tp, _ = MODELS[case.model]
    context = any(word in case.layout for word in CONTEXT)
    if case.kind == "train" and case.backend in (*GPU_BACKENDS, "flex"):
        return f"{case.backend} attention has no backward here (cpu, {case.dtype}): NotImplementedError"
    if case.backend in GPU_BACKENDS:
        return GPU_BACKENDS[case.backend]
    if "tp" in case.layout and not has_tp:
        return f"{class_name} defines no _tp_plan"
    if context and not has_cp:
        return f"{class_name} defines no _cp_plan"
    if case.kind == "train" and case.model in ("minimax_h3", "qwenimage21"):
        return f"no training recipe for {case.model}: its output is not shaped like `hidden_states`"
    if case.kind == "train" and case.layout.endswith("any"):
        return f"the {case.layout} layout has no backward in diffusers"
    return None


def known_issue(case: CaseResult) -> tuple[str, str] | None:
    """("raising" or "silent", key) of the known issue a run case meets, or None."""
    layout, plain = case.layout, case.layout in ("ulysses2", "ring2", "ulysses4", "ring4", "ring2xulysses2")
    rules = [
        ("tp" in layout and "+" in layout, "raising", "tp_cp"),
        ("ring" in layout and case.backend in ("native", "_native_math"), "raising", "lse"),
        (plain and (case.shape == "txt7" or (case.shape.startswith("img") and case.world_size == 4)), "raising",
         "uneven"),
        (layout.endswith("any") and case.shape.startswith("img"), "raising", "gloo"),
        (case.shape == "masked" and case.backend == "_native_flash", "raising", "mask"),
        (case.model == "ltx2" and case.shape == "default" and "ulysses" in layout + "ring", "raising", "audio"),
        (case.model.startswith("ltx") and case.shape == "masked" and "ulysses" in layout, "raising", "ltx_mask"),
        (case.dtype == "fp16" and any(word in layout for word in CONTEXT), "raising", "fp16"),
        (case.model in ("chronoedit", "minimax_h3") and "ulysses" in layout, "raising", "chrono"),
        (case.model == "wan" and case.shape == "ti2v" and "ring" in layout, "silent", "wan"),
        (case.kind == "train" and case.dtype != "fp32" and case.model in ("qwenimage", "helios_amplify", "ltx",
                                                                           "flux2")
         and any(word in layout for word in CONTEXT), "raising", "mixed"),
        (case.kind == "train" and layout.startswith("tp"), "silent", "tp"),
        (case.kind == "train" and "ring4" in layout, "silent", "ring4"),
        (case.kind == "train" and case.model.startswith("helios") and any(w in layout for w in CONTEXT), "silent",
         "helios_train"),
        (case.kind != "train" and case.model == "helios_amplify" and any(w in layout for w in CONTEXT), "silent",
         "helios"),
    ]
    return next(((how, key) for matched, how, key in rules if matched), None)


def traceback_text(model: str, error: str) -> str:
    """A worker traceback of the usual length (35 frames), the same for a model and an error across its cases."""
    frames = [("harness/engine/worker.py", 166, "run", "output, info = self.run_case(case)"),
              ("harness/engine/worker.py", 99, "run_case", "output = forward()"),
              ("harness/run/capture.py", 18, "run_model", "return model(**inputs, return_dict=False)[0]")]
    frames += [(f"diffusers/models/transformers/transformer_{model}.py", 200 + 7 * i, f"forward_{i}",
                f"hidden_states = block(hidden_states, encoder_hidden_states, temb, rotary_emb_{i})")
               for i in range(14)]
    frames += [("diffusers/hooks/context_parallel.py", 274, "shard", "assert tensor.size()[dim] % mesh.size() == 0")]
    lines = ["Traceback (most recent call last):"]
    for path, line, name, code in frames:
        lines += [f'  File "/work/main/.venv/lib/python3.11/site-packages/{path}", line {line}, in {name}',
                  f"    {code}", "    " + "^" * min(len(code), 60)]
    return "\n".join([*lines, error]) + "\n"


def _spec(kind: str, name: str) -> figures.FigureSpec:
    return next(spec for spec in KINDS[kind].figures if spec.name == name)


def run_extras(case: CaseResult, rng: random.Random) -> None:
    """What every case that ran records besides its figures: timings, memory, functions, comms per pattern."""
    ranks = case.world_size
    case.seconds, case.peak_mem_mb = rng.uniform(0.04, 6.0), round(rng.uniform(420, 560), 1)
    case.dispatched = f"{case.backend}:{rng.choice((2, 4, 6))}"
    case.kernels = "aten::_scaled_dot_product_flash_attention_for_cpu:2"
    case.comms = "" if ranks == 1 else f"all_gather:1 all_to_all:8 ({rng.uniform(5, 60):.1f} kB)"
    phases = ("model build", "parallel setup", "forward", "gathers", "baselines", "metrics and images")
    case.extra.update({
        "peak_mem_mb_per_rank": [round(case.peak_mem_mb - 0.1 * r, 1) for r in range(ranks)],
        "seconds_per_rank": [round(case.seconds + 0.001 * r, 4) for r in range(ranks)],
        "forward_s": rng.uniform(0.02, 0.4), "phases": {name: round(rng.uniform(0, 0.05), 4) for name in phases},
        "functions": {f"diffusers.models.attention_dispatch._{case.backend.strip('_')}_attention": 2},
        "rank_max_diff": [0.0] * ranks})
    if ranks > 1:
        case.extra["comms"] = [{"modules": pattern, "count": 1, "recorded": {op: [4, 6144 * ranks]},
                                "expected": {op: 4}} for pattern, op in (("proj_out", "all_gather"),
                                ("transformer_blocks.*.attn", "all_to_all"),
                                ("single_transformer_blocks.*.attn", "all_to_all"))]


def tensor_figures(case: CaseResult, rng: random.Random, scale: float) -> None:
    level = {"fp32": 2e-7, "bf16": 7.7e-3, "fp16": 1e-3}[case.dtype] * scale
    limit = {"fp32": 1e-5, "bf16": 0.15, "fp16": 2e-2}[case.dtype]
    value = level * rng.lognormvariate(0, 0.3)
    names = [("max_abs_err", value, limit), ("mean_abs_err", value / 8, None), ("max_rel_err", value * 0.8, None),
             ("nonfinite", 0, None)]
    if case.dtype != "fp32":
        names += [("baseline_err", value / 8, None), ("err_ratio", rng.uniform(0.95, 1.05), 1.25),
                  ("max_err_ratio", rng.uniform(0.95, 1.05), 1.5)]
    names.append(("vs_baseline_max_abs", value * rng.uniform(0, 1), None))
    case.figures = [_spec("tensor", name).of(v, lim) for name, v, lim in names]
    counts = [0, 0, rng.randrange(40), rng.randrange(20), rng.randrange(9), 0, 0, 0, 0, 0, 0]
    case.extra["blocks"] = [figures.histogram("Absolute error histogram", [10.0 ** p for p in range(-10, 2)], counts,
                                              limit)]


def image_figures(case: CaseResult, rng: random.Random) -> None:
    fp32 = case.dtype == "fp32"
    names = [("ssim", 1 - rng.uniform(1e-9, 1e-7) if fp32 else rng.uniform(0.9991, 0.9999), 0.9999 if fp32 else 0.99),
             ("psnr", rng.uniform(90, 135) if fp32 else rng.uniform(46, 60), 60.0 if fp32 else 38.0),
             ("max_abs_err", rng.uniform(1e-6, 1e-4) if fp32 else rng.uniform(0.01, 0.03), 5e-3 if fp32 else 0.1),
             ("mean_abs_err", rng.uniform(1e-7, 1e-5), None), ("nonfinite", 0, None)]
    case.figures = [_spec("image", name).of(v, lim) for name, v, lim in names]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", case.case_id)
    case.extra["images"] = {name: f"images/{slug}-{name}.png"
                            for name in ("reference", "candidate", "diff", "ssim_map")}


def train_figures(case: CaseResult, rng: random.Random, scale: float) -> None:
    grad = {"fp32": 4e-7, "bf16": 1e-2, "fp16": 2e-3}[case.dtype] * scale * rng.lognormvariate(0, 0.3)
    worst = rng.choice(PARAMS)
    names = [("grad_err", grad, 1e-4 if case.dtype == "fp32" else 0.0123), ("loss_err", grad / 20, 1e-5),
             ("worst_param", worst, None), ("weight_max_abs_err", grad * 0.5, None), ("nonfinite", 0, None)]
    if case.dtype != "fp32":
        names += [("baseline_err", grad * 0.98, None), ("err_ratio", rng.uniform(0.95, 1.05), 1.25)]
    case.figures = [_spec("train", name).of(v, lim) for name, v, lim in names]
    reference = [2.2404, 2.1477, 1.7290]
    lines = [("reference (fp32, one device)", reference, "ref"),
             ("this layout", [v + rng.uniform(-1, 1) * grad for v in reference], "run")]
    if case.dtype != "fp32":
        lines.append((f"one device, {case.dtype}", [v + rng.uniform(-1, 1) * grad for v in reference], "base"))
    rows = [[name, grad * rng.uniform(0.1, 1), grad * 0.1, grad * 0.9, grad, grad * 2]
            for name in rng.sample(PARAMS, 10)]
    case.extra["blocks"] = [figures.series("Loss per step", lines),
                            figures.table("Step-1 gradients furthest from the reference", ["parameter", "rel L2 err",
                                          "max abs err", "one device, same dtype", "largest noise draw", "limit"],
                                          rows, code_columns=(0,))]
    case.extra["train"] = {"closest_to_limit": {"param": worst, "ratio": rng.uniform(0, 1)}, "loss_limit": 1e-5,
                           "noise": {name: {"loss_rel_err": rng.uniform(0, 1e-3), "grad_err": grad}
                                     for name in ("single", "nudged:1", "nudged:2")} if case.dtype != "fp32" else None,
                           "loss_abs_err": grad / 10, "loss_bitwise_equal": False, "grad_max_abs_err": grad / 3,
                           "engine": None, "disagreement": {}, "missing": []}
