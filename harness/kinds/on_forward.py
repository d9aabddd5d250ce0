"""What the kinds that ask `enable_parallelism` something around the tensor kind's forward share (removal, refusal):
the tensor kind's references and its build of the model, eager only, their own models and layouts, the default shape.

The tensor kind's judging is not theirs (its limits, noise draws, repro scripts, compile and load slices): they use
its forward as a part instead of inheriting the whole kind, so that they undo none of it (Kind's defaults fit them).
"""

from __future__ import annotations

from harness.core.figures import FigureSpec
from harness.core.options import Option
from harness.kinds.base import Kind
from harness.kinds.tensor import TensorKind

FORWARD = TensorKind()  # whose references these kinds read and whose build (`FORWARD.build`) gives their model
# The run under the layout against the fp32 reference: shown, not judged (the tensor kind judges it).
LAYOUT_ABS = FigureSpec("layout_max_abs", "under the layout: max abs err to the fp32 reference")


class OnForwardKind(Kind):
    """An eager kind on the tensor kind's forward. Its run returns a dict whose "layout" entry is the output under the
    layout; `kept` names the entry kept after the case and compared across the ranks."""

    references = FORWARD.name
    compiles = False
    loads = False  # what enable_parallelism does to a built model: how it was loaded is not the question
    layouts_option: Option  # the layouts it runs unless told (`--<kind>-layouts`), and why those
    kept = "layout"

    @property
    def options(self) -> tuple[Option, ...]:
        """Its own models (default: --models), layouts and shapes (default: the default shape)."""
        return (Option("models", None, f"Models the {self.name} kind runs (default: those of --models).", is_list=True),
                self.layouts_option,
                Option("shapes", ["default"], f"Shapes the {self.name} kind runs.", is_list=True))

    def shapes(self, spec, wanted, weights_dir):
        return FORWARD.shapes(spec, wanted, weights_dir)

    def split_lengths(self, case) -> dict[str, int]:
        return FORWARD.split_lengths(case)

    def reference_hash(self, case) -> str:
        return FORWARD.reference_hash(case)

    def detach(self, output):
        return output[self.kept].float().cpu()

    def comparable(self, output):
        return super().comparable(output[self.kept])

    @staticmethod
    def layout_max_abs(output, reference) -> float:
        """The `LAYOUT_ABS` figure's value: the output under the layout against the fp32 reference."""
        from harness.rank.compare import tensor_metrics

        return tensor_metrics(output["layout"].float().cpu(), reference.output)["max_abs_err"]
