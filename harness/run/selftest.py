"""`harness selftest`: prove on this stack that a PASS means something.

Runs real cases with deliberate bugs (harness.faults) next to the same cases without them. The harness passes
its own test only if every faulty case is FAIL for the expected reason and every clean twin is PASS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from harness import faults
from harness.core import axes
from harness.core.layouts import parse_layout
from harness.core.records import Case
from harness.core.results import Status
from harness.report.matrix import WIDTH
from harness.run import flow_controls, reference_drift, runner
from harness.run.known_issues import load_known_issues
from harness.run.plan import PlannedCase, max_ranks, skip_reason
from harness.run.settings import Settings


@dataclass(frozen=True)
class Control:
    model: str
    layout: str
    backend: str
    dtype: str
    fault: str
    expected: str  # what the FAIL reason must say
    kind: str = "tensor"
    clean: Status = Status.PASS  # the clean twin's status (XFAIL: a known issue the fault must not hide behind)
    mode: str = "eager"  # compiled modes (harness.core.modes): the bug must be caught in what the compiler made
    load: str = "enable"  # checkpoint loads (harness.loads): the bug is in how the weights were read
    flow: str = "none"  # the user's calls around enable_parallelism (harness.flows): the bug is in what they did
    eager: Status | None = None  # a compiled control's fault run eager, where it must come out so (PASS: only the
    # compiler's output is wrong, so the compiled case is what caught it)

    def __post_init__(self):
        faults.check(self.fault)  # a misspelt fault fails as the table is read, not in the middle of a selftest

    @property
    def case(self) -> Case:
        """The faulty case; its clean twin and its eager run are this case without the fault or compiled."""
        return Case(self.model, parse_layout(self.layout), self.backend, self.dtype, self.kind, fault=self.fault,
                    mode=self.mode, load=self.load, flow=self.flow)

    @property
    def name(self) -> str:
        return self.case.case_id

    @property
    def clean_id(self) -> str:
        return replace(self.case, fault=None).case_id

    @property
    def eager_id(self) -> str:
        return replace(self.case, mode="eager").case_id


_QUERY = "transformer_blocks.0.attn.to_q"

CONTROLS = [
    Control("flux", "ulysses2", "native", "fp32", "cp_local_attention", "> tolerance"),
    Control("flux", "ring2", "_native_flash", "fp32", "cp_local_attention", "> tolerance"),
    Control("flux", "ulysses2", "native", "bf16", "cp_local_attention", "error budget"),
    Control("flux", "ring2", "_native_flash", "bf16", "extra_rounding", "error budget"),
    Control("qwenimage", "ulysses2", "native", "fp32", "cp_local_attention", "> tolerance"),
    Control("flux", "tp2", "native", "fp32", "tp_skip_allreduce", "> tolerance"),
    Control("flux2", "tp2", "native", "fp32", "tp_skip_allreduce", "> tolerance"),
    Control("flux", "single", "_native_math", "fp32", "redirect_dispatch", "requested _native_math, dispatched native"),
    Control("flux", "tp2", "_native_math", "fp32", "math_runs_flash", "but kernel(s) aten::_scaled_dot_product_flash"),
    Control("flux", "single", "native", "fp32", "scaled_softmax", "> tolerance"),
    Control("flux", "tp2", "_native_flash", "fp32", "redirect_same_kernel", "but diffusers.models.attention_dispatch"
                                                                            "._native_attention:"),
    Control("flux", "tp2", "native", "fp32", "rope_sign", "> tolerance"),  # diffusers changed: layouts still agree
    # Repeat determinism: rank 1's attention moves a little more at every call, inside every limit but bit for bit
    Control("flux", "ulysses2", "native", "fp32", "nondeterministic:transformer_blocks.0.attn", "not repeatable"),
    Control("flux", "ulysses2", "native", "fp32", "nondeterministic:transformer_blocks.0.ff", "not repeatable",
            "train"),
    Control("flux", "ulysses2", "native", "fp32", "rank1_diverges", "rank 1's output differs from rank 0's"),
    Control("flux", "ulysses2", "native", "bf16", "bf16_few_tokens", "error budget: max abs err"),
    # Below bf16's own error against fp32 (flux2's is 0.083, the bug's 0.025), above the noise between a layout and
    # one device (0.0078): only the judge against the same-dtype single-device output sees it.
    Control("flux2", "ulysses2", "native", "bf16", "rank1_part_2pct", "vs single-device bf16: max abs diff"),
    Control("flux", "ulysses2", "native", "fp16", "cp_local_attention", "> tolerance"),
    Control("flux", "ring2xulysses2", "_native_flash", "fp32", "cp_local_attention", "> tolerance"),  # 4 ranks
    Control("flux", "ulysses2any", "native", "fp32", "cp_local_attention", "> tolerance"),
    Control("flux", "tcp2", "native", "fp32", "tcp_own_kv_chunk", "> tolerance"),  # PyTorch's own ring
    Control("flux", "tcp2", "native", "fp32", "tcp_positions_reversed", "> tolerance"),  # its buffers
    # Compiled (aot_eager, the cheap backend): the fault is traced into the graph, and its proof read from the graph.
    Control("flux", "ulysses2", "native", "fp32", "cp_local_attention", "> tolerance", mode="aot_eager"),
    Control("flux", "ulysses2", "native", "fp32", "compiled_only", "> tolerance", mode="aot_eager",
            eager=Status.PASS),
    # A cache's blocks run outside every compiled graph (MagCache's hooks are torch.compiler.disable'd): the proof
    # records that remainder op by op, and sees the attention left without its exchange there
    Control("flux", "ulysses2", "native", "fp32", "cp_attention_left_out", "transformer_blocks.0.attn: 0 all_to_all",
            mode="aot_eager", flow="cache_mag"),
    Control("flux", "tp2", "native", "fp32", "tp_skip_allreduce", "> tolerance", mode="aot_eager"),  # DTensor traced
    # Compiled training: forward and backward through AOTAutograd; the CP attention's backward is wrong only there.
    # The compiled backward is proven too: diffusers' CP backward runs outside the graphs, recorded as it runs.
    Control("flux", "ulysses2", "native", "fp32", "cp_backward_local_only", "(backward): 0 all_to_all, expected >= 8",
            "train", mode="aot_eager"),
    Control("flux", "ulysses2", "native", "fp32", "cp_local_attention", "gradient of", "train", mode="aot_eager"),
    Control("flux", "tp2", "flex", "fp32", "tp_skip_allreduce", "rank 1's output differs from rank 0's"),
    Control("flux", "ulysses2", "native", "fp32", "cp_local_attention", "vs fp32 reference: ssim", "image"),
    Control("flux", "ulysses2", "native", "bf16", "cp_local_attention", "vs single-device bf16: ssim", "image"),
    Control("qwenimage", "tp2", "native", "fp32", "tp_skip_allreduce", "vs fp32 reference: ssim", "image"),
    Control("flux", "ulysses2", "native", "fp32", "train_skip_cp_reduction", "the ranks disagree", "train"),
    Control("flux", "ulysses2", "native", "fp32", "train_double_cp_reduction", "gradient of", "train"),
    Control("flux", "dp2", "native", "fp32", "train_skip_dp_reduction", "no gradient for", "train"),
    Control("flux", "ulysses2", "native", "fp32", "cp_backward_local_only", "gradient of", "train"),
    Control("flux", "tcp2", "native", "fp32", "tcp_own_kv_chunk", "gradient of", "train"),  # PyTorch's ring backward
    Control("flux", "dp2", "native", "fp32", "dp_same_samples", "loss: rel err", "train"),
    Control("flux", "dp2xtcp2", "native", "fp32", "dp_same_samples", "loss: rel err", "train"),  # FSDP2 x torch CP
    Control("qwenimage", "ring2", "_native_flash", "fp32", "cp_backward_local_only", "gradient of", "train"),
    Control("flux", "ulysses2", "native", "bf16", "cp_backward_local_only", "gradient", "train"),
    # The communication proof: each is also wrong in numbers, but the FAIL names the exchange that never happened.
    Control("flux", "ulysses2", "native", "fp32", "cp_attention_left_out",
            "missing: transformer_blocks.0.attn: 0 all_to_all, expected >= 4"),
    Control("flux", "ring2", "_native_flash", "fp32", "cp_attention_left_out",
            "missing: transformer_blocks.0.attn: 0 all_gather, expected >= 1"),
    Control("flux", "ring2", "_native_flash", "fp32", "ring_skips_exchange",
            "; single_transformer_blocks.0.attn: 0 all_gather, expected >= 1"),
    Control("flux", "tp2", "native", "fp32", "tp_skip_allreduce", "transformer_blocks.0.attn.to_out.0: 0 all_reduce"),
    Control("flux", "ulysses2", "native", "fp32", "cp_attention_left_out",
            "missing: transformer_blocks.0.attn: 0 all_to_all, expected >= 8", "image"),
    # What diffusers must refuse (harness.catalogue.refusals): a plan input named after no argument, accepted in
    # silence, fails by the refusal it should have made; every other invalid input is still refused.
    Control("flux", "ulysses2", "native", "fp32", "cp_plan_input_typo_ignored",
            "diffusers accepted a `_cp_plan` input named after no argument", "refusal"),
    # The loads users take (from_pretrained with a parallel_config): a sharded loader that reads another rank's slice
    # fails the shard check by name (the numbers fail too); CP hooks that were never installed fail the communication
    # proof while the numbers pass (every rank computes the whole sequence).
    Control("flux", "tp2", "native", "fp32", "load_wrong_slice", "differs from enable_parallelism's",
            load="pretrained"),
    Control("flux", "ulysses2", "native", "fp32", "load_cp_hooks_dropped",
            "missing: transformer_blocks.0.attn: 0 all_to_all, expected >= 4", load="pretrained_wrapped"),
    # What users call around enable_parallelism (harness.flows): a LoRA scale that reaches one rank only, a fused
    # projection built wrong on one rank; the gathered output is wrong in the part that rank computed.
    Control("flux", "ulysses2", "native", "fp32", "lora_scale_one_rank", "> tolerance", flow="lora_scaled"),
    Control("flux", "ulysses2", "native", "fp32", "fused_qkv_one_rank", "> tolerance", flow="fused_qkv"),
    # A cache that never reuses: the loop's per-step record shows no step computing less (harness.run.decisions)
    Control("flux", "tp2", "native", "fp32", "cache_never_reuses", "the cache reused nothing", flow="cache_fbc"),
    # Rank 1's cache decides the other way after its warm-up: qwenimage's all-reduces still pair up (same sizes), so the
    # run ends and the per-step record names the first step the ranks disagree at
    Control("qwenimage", "tp2", "native", "fp32", "cache_decides_alone", "step 1 cond: the ranks decided differently",
            flow="cache_taylorseer"),
    # The same through the pipeline's own loop (a picture, harness.flows.pipeline_loop): its record names the step
    Control("qwenimage", "tp2", "native", "fp32", "cache_decides_alone", "cond: the ranks decided differently", "image",
            flow="cache_taylorseer"),
    # A known issue excuses only its evidence: a second TP training bug in cells that are XFAIL for the first one
    # (the per-head norm weights) must come out FAIL, naming what the known issue does not.
    Control("flux", "tp2", "native", "fp32", "tp_colwise_input_grad", "x_embedder", "train", Status.XFAIL),
    Control("qwenimage", "tp2", "native", "fp32", "tp_colwise_input_grad", "img_in", "train", Status.XFAIL),
    # A failed proof is excused only as its entry names it (processor_after: 0 exchanges at the attention modules): a
    # proof failure it does not name, beside the one it does, keeps the case FAIL
    Control("flux", "ulysses2", "native", "fp32", "redirect_dispatch", "requested native, dispatched _native_math",
            clean=Status.XFAIL, flow="processor_after"),
    # Low-precision limits come from measured noise: a 10% error in one layer's gradients, in bf16, in every layout.
    *(Control("flux", layout, backend, "bf16", f"grad_scale:{_QUERY}", f"gradient of {_QUERY}.", "train", clean)
      for layout, backend, clean in (("ulysses2", "native", Status.PASS), ("ring2", "_native_flash", Status.PASS),
                                     ("ring2xulysses2", "_native_flash", Status.PASS), ("tp2", "native", Status.XFAIL),
                                     ("dp2", "native", Status.PASS), ("dp2xulysses2", "native", Status.PASS))),
    # The function that ran, against the catalogue (never the registry): the registry holds native's function under
    # _native_flash's name, counted as _native_flash, in every cell.
    *(Control("flux", layout, "_native_flash", dtype, "redirect_same_kernel", "but diffusers.models.attention_dispatch"
                                                                               "._native_attention:")
      for layout, dtype in (("single", "bf16"), ("ulysses2", "fp32"), ("ulysses2", "bf16"), ("tp2", "bf16"))),
]




@dataclass(frozen=True)
class Broken:
    """A bug in exactly one module; localization must name that module first. A bug that is no module's of the
    layout (`where`: a compiled-only bug, named under compile; a change to diffusers, which one device has too) must
    be said as such (`says`), naming the module where it first shows, if any (`where`)."""

    model: str
    layout: str
    backend: str
    fault: str  # `name:module.path`, a targeted fault (harness.faults.targeted); or any fault with `says`
    dtype: str = "fp32"
    kind: str = "tensor"
    mode: str = "eager"
    says: str = ""  # what the line must say before the module (a bug not of the layout's modules)
    where: str = ""  # the module a fault that is not targeted first shows at ("": none)
    reference: bool = False  # named where one device first left its stored reference (a change every device shares)

    def __post_init__(self):
        if not self.module and not self.says:  # read through the registry: an unknown fault fails as it is read
            raise ValueError(f"{self.fault!r}: a localization control needs a targeted fault (`name:module.path`)")

    @property
    def module(self) -> str:
        return self.where or faults.find(self.fault)[1]

    @property
    def case(self) -> Case:
        return Case(self.model, parse_layout(self.layout), self.backend, self.dtype, self.kind, fault=self.fault,
                    mode=self.mode)

    def named(self, line: str | None) -> bool:
        """The first divergence is the broken module (or, for a computation between its children, said of it);
        a wrong backward is named in the backward; a bug not of the layout says what it is first."""
        line = line or ""
        if self.says:
            if not line.startswith(self.says):
                return False
            if not self.module:
                return True
            line = line.rpartition(" traced: " if " traced: " in line else "first off the stored reference: ")[2]
        line = line.removeprefix("backward: ")
        return line.startswith(f"{self.module}:") or line.startswith(f"{self.module} (")


LOCALIZE_CONTROLS = [
    Broken("flux", "ulysses2", "native", "scale_output:transformer_blocks.0.attn"),
    Broken("flux", "ulysses2", "native", "scale_output:single_transformer_blocks.0.attn"),
    Broken("flux", "ring2", "_native_flash", "scale_output:transformer_blocks.0.ff"),
    Broken("flux", "ulysses2", "native", "scale_output:x_embedder"),
    Broken("flux", "ulysses2", "native", "local_attention:transformer_blocks.0.attn"),
    Broken("flux", "ring2", "_native_flash", "local_attention:single_transformer_blocks.0.attn"),
    Broken("flux", "ulysses2", "native", "local_attention:single_transformer_blocks.0.attn", "bf16"),
    Broken("flux", "tp2", "native", "skip_allreduce:transformer_blocks.0.attn.to_out.0"),
    Broken("flux", "tp2", "native", "skip_allreduce:transformer_blocks.0.ff.net.2"),
    Broken("flux", "tp2", "native", "skip_allreduce:transformer_blocks.0.ff_context.net.2"),
    Broken("flux", "tp2", "native", "scale_output:transformer_blocks.0.ff"),
    Broken("qwenimage", "ulysses2", "native", "scale_output:transformer_blocks.1.attn"),
    Broken("qwenimage", "ring2", "_native_flash", "scale_output:transformer_blocks.0.img_mlp"),
    Broken("qwenimage", "ulysses2", "native", "local_attention:transformer_blocks.1.attn"),
    Broken("qwenimage", "tp2", "native", "skip_allreduce:transformer_blocks.1.attn.to_out.0"),
    Broken("qwenimage", "tp2", "native", "skip_allreduce:transformer_blocks.0.txt_mlp.net.2"),
    Broken("qwenimage", "tp2", "native", "skip_allreduce:transformer_blocks.0.img_mlp.net.2", "bf16"),
    Broken("wan", "ulysses2", "native", "scale_output:blocks.0.attn1"),
    Broken("wan", "ulysses2", "native", "local_attention:blocks.1.attn1"),
    Broken("wan", "ring2", "_native_flash", "scale_output:blocks.1.ffn"),
    Broken("flux2", "ulysses2", "native", "scale_output:transformer_blocks.0.attn"),
    Broken("flux2", "tp2", "native", "skip_allreduce:transformer_blocks.0.ff.linear_out"),
    Broken("flux", "ulysses2", "native", "wrong_grad:transformer_blocks.0.ff", kind="train"),
    Broken("flux", "ring2", "_native_flash", "wrong_grad:single_transformer_blocks.0.proj_out", kind="train"),
    Broken("qwenimage", "ulysses2", "native", "wrong_grad:transformer_blocks.1.img_mlp", kind="train"),
    Broken("flux", "tp2", "native", "wrong_grad:transformer_blocks.0.ff", kind="train"),
    # The batch split over data parallel and the sequence over context parallel: both gathered.
    Broken("flux", "dp2xulysses2", "native", "wrong_grad:transformer_blocks.0.ff", kind="train"),
    Broken("flux", "dp2xulysses2", "native", "scale_output:transformer_blocks.0.attn", kind="train"),
    # A wrong attention backward is first seen in a child (the gradient reaching attn.norm_q): the attention is named.
    Broken("flux", "ulysses2", "native", "attention_grad:transformer_blocks.0.attn", kind="train"),
    Broken("qwenimage", "ring2", "_native_flash", "attention_grad:transformer_blocks.1.attn", kind="train"),
    # Not a bug of the layout's modules: SDPA wrong only in compiled code (named under compile, block by block), and
    # a change to diffusers that one device has too (said as such; the reference holds no module outputs).
    Broken("flux", "ulysses2", "native", "compiled_only", mode="aot_eager",
           says="the divergence comes from compiling (eager: every module within its limit)",
           where="transformer_blocks.0.attn"),
    Broken("flux", "tp2", "native", "rope_sign", says="none between the layout and one device, and the single-device "
                                                      "fp32 run is off the reference as far",
           where="transformer_blocks.0.attn"),
    # A change to diffusers in one module that every device shares, inside the layouts' tolerance: where one device
    # first left its stored reference (its module fingerprints), forward for tensor and image, both ways for train.
    Broken("flux", "ulysses2", "native", "shared_scale:transformer_blocks.0.attn.norm_q", reference=True),  # a norm
    Broken("flux", "tp2", "native", "shared_scale:x_embedder", reference=True),  # an embedding
    Broken("flux", "ulysses2", "native", "shared_scale:single_transformer_blocks.0.proj_out", kind="image",
           reference=True),  # a projection
    Broken("qwenimage", "ulysses2", "native", "shared_scale:transformer_blocks.1.img_mlp", reference=True),
    Broken("flux", "ulysses2", "native", "shared_scale:transformer_blocks.0.ff", kind="train", reference=True),
    Broken("flux", "ulysses2", "native", "shared_grad:transformer_blocks.0.ff", kind="train", reference=True,
           says="backward: "),
    Broken("flux", "ulysses2", "native", "rope_sign", kind="train", reference=True, where="transformer_blocks.0.attn",
           says="transformer_blocks.0.attn (first seen at its to_out.0)"),  # inside the attention, between children
]


def control_plan(cpu_max_ranks: int, controls=tuple(CONTROLS), generated=()) -> list[PlannedCase]:
    """The cases of `controls` (each faulty case, its clean twin and its eager run) and of the `generated` flow
    controls (harness.run.flow_controls), each once."""
    plan, seen, limit = [], set(), max_ranks(cpu_max_ranks)
    cases = [(replace(control.case, fault=None), control.case,
              *((replace(control.case, mode="eager"),) if control.eager is not None else ())) for control in controls]
    cases += [(control.clean, control.case) for control in generated if control.case is not None]
    for case in (case for group in cases for case in group):
        if case.case_id not in seen:
            seen.add(case.case_id)
            plan.append(PlannedCase(case, skip_reason(case, limit)))
    return plan


def caught(control: Control, by_id: dict) -> bool:
    clean, faulty = by_id[control.clean_id], by_id[control.name]
    eager_right = control.eager is None or by_id[control.eager_id].status is control.eager
    return (faulty.status is Status.FAIL and control.expected in faulty.reason and clean.status is control.clean
            and eager_right)


def localize_selftest(settings: Settings, echo: Callable[[str], None] = print) -> int:
    """Each bug in exactly one module must be named first by localization (at least all but one of them), and the
    clean twins must localize to no module."""
    limit = max_ranks(settings.cpu_max_ranks)
    plan, seen = [], set()
    for broken in LOCALIZE_CONTROLS:
        for case in (broken.case, replace(broken.case, fault=None)):
            if case.case_id not in seen:
                seen.add(case.case_id)
                plan.append(PlannedCase(case, skip_reason(case, limit)))
    summary = runner.run(replace(settings, localize=True), plan, echo=echo, purpose="selftest")
    by_id = {result.case_id: result for result in summary.results}
    echo("\nselftest --localize: a bug in one module must be named first")
    named = 0
    for broken in LOCALIZE_CONTROLS:
        result = by_id[broken.case.case_id]
        line = reference_drift.moved(result) if broken.reference else result.first_divergence
        found = broken.named(line)
        named += found
        echo(f"  {'named ' if found else 'MISSED'}  {broken.case.case_id:78s} {line}")
    clean = [r for r in summary.results if r.case_id in seen and axes.parse(r.case_id)["fault"] is None]
    # a clean twin may fail by a bug of diffusers' own (flux under tp2 trains its QK-norm weights per rank): what it
    # must never do is name a module, as only the broken twin's bug may
    noisy = [r for r in clean if r.first_divergence and not r.first_divergence.startswith(("none", "not localized"))]
    for result in noisy:
        echo(f"  NOISY   {result.case_id}: a clean case localized to {result.first_divergence}")
    ok = named >= len(LOCALIZE_CONTROLS) - 1 and not noisy
    echo(f"named {named} of {len(LOCALIZE_CONTROLS)}; clean twins localized to no module: {not noisy}")
    return 0 if ok else 1


REGISTRY_MIXUP = ("_native_flash", "native")  # the name, and the backend whose function it holds
REGISTRY_CELLS = (["single", "ulysses2", "ring2", "tp2"], ["native", "_native_flash"], ["fp32", "bf16"],
                  ("tensor", "train"))


def registry_control(settings: Settings) -> tuple[bool, str]:
    """A registration mistake at import (`_native_flash` holding `native`'s function) must make every cell of both
    names an ERROR at plan time: no case of either can prove which backend ran."""
    from harness.run.plan import build_plan

    layouts, names, dtypes, kinds = REGISTRY_CELLS
    with faults.backends.registry_rewritten(*REGISTRY_MIXUP):
        plan = build_plan(["flux"], layouts, names, dtypes, cpu_max_ranks=settings.cpu_max_ranks, kinds=kinds)
    cells = [p for p in plan if p.skip_reason is None]
    wrong = [p.case.case_id for p in cells if p.plan_error is None]
    line = (f"{len(cells) - len(wrong)} of {len(cells)} cells ERROR at plan time"
            + (f"; not: {', '.join(wrong[:3])}" if wrong else f": {cells[0].plan_error[:90]}" if cells else ""))
    return bool(cells) and not wrong, line


# What the selftest shows of the run beneath it: where it stands and what it cost, not each case nor the matrix.
_SHOWN = ("plan:", "launching", "note:", "time:", "interrupted")


def selftest(settings: Settings, echo: Callable[[str], None] = print, flow_values=None, table: bool = True) -> int:
    """The controls of the table (unless not `table`) and every flow's generated control (or those of
    `flow_values`, harness.run.flow_controls); 0 only if each is caught."""
    issues = load_known_issues(settings.path("known_issues"))
    generated = flow_controls.generate(flow_values, lambda case_id: max(
        (2 if issue.status == "ERROR" else 1 for issue in issues if issue.applies(case_id)), default=0))
    controls = CONTROLS if table else []
    summary = runner.run(settings, control_plan(settings.cpu_max_ranks, controls, generated), localize_failures=False,
                         purpose="selftest",
                         echo=lambda line: echo(line) if line.lstrip().startswith(_SHOWN) else None)
    by_id = {result.case_id: result for result in summary.results}
    ok = True
    if table:
        echo("\nselftest: each deliberate bug must FAIL, its clean twin PASS (or stay XFAIL where it is a known issue)")
        echo(f"  {'':6s}  {'fault':22s} {'case':45s} {'caught by':20s} figure")
        for control in controls:
            found = caught(control, by_id)
            ok &= found
            echo(_row(control, by_id, found))
        registry_ok, registry_line = registry_control(settings)
        ok &= registry_ok
        echo(f"  {'caught' if registry_ok else 'MISSED'}  {'registry mixup (import)':22s} {registry_line}"[:WIDTH])
    ok &= _flow_rows(generated, by_id, echo)
    echo(f"reports: {settings.path('report_dir') / 'index.html'}")
    echo("selftest passed: the harness caught every deliberate bug" if ok else
         "selftest FAILED: a deliberate bug went unreported, so a PASS from this stack proves nothing")
    return 0 if ok else 1


def _flow_rows(generated, by_id: dict, echo: Callable[[str], None]) -> bool:
    """The generated flow controls, a row each; False if any flow's control was not caught (it tests nothing)."""
    if not generated:
        return True
    echo(f"\nflows: every rank but rank 0 leaves the flow's calls out; its case must not PASS ({flow_controls.MODEL}, "
         f"fp32)")
    missed = []
    for control in generated:
        said, why = control.verdict(by_id)
        where = control.case.layout.name if control.case is not None else "-"
        echo(f"  {said:6s}  {control.label:34s} {where:9s} {why}"[:WIDTH])
        if said == "MISSED":
            missed.append(control.label)
    if missed:
        echo(f"flows whose control was not caught (they test nothing): {', '.join(missed)}"[:WIDTH])
    return not missed


def _row(control: Control, by_id: dict, found: bool) -> str:
    """One control: caught or not, its fault, the case, the checks that caught it and the first figure among them."""
    faulty, clean = by_id[control.name], by_id[control.clean_id]
    items = [item for item in faulty.evidence if "known" not in item] or faulty.evidence
    checks = ",".join(dict.fromkeys(item["check"].removeprefix("proof.") for item in items)) or "-"
    numbers = next((item for item in items if isinstance(item.get("value"), int | float)
                    and isinstance(item.get("limit"), int | float)), None)
    figure = f"{numbers['value']:.3g} vs {numbers['limit']:.3g}" if numbers else ""
    if not found:
        eager = f", eager {by_id[control.eager_id].status.value}" if control.eager is not None else ""
        figure = f"faulty {faulty.status.value}, clean {clean.status.value}{eager}: {faulty.reason[:40]}"
    fault = control.fault if len(control.fault) <= 22 else control.fault[:19] + "..."
    checks = checks if len(checks) <= 20 else checks[:17] + "..."
    return f"  {'caught' if found else 'MISSED'}  {fault:22s} {control.clean_id:45s} {checks:20s} {figure}"[:WIDTH]
