import math

import pytest
import torch

from harness.rank.compare import tensor_metrics


def test_metrics_of_a_known_difference():
    reference = torch.tensor([1.0, -2.0, 4.0])
    metrics = tensor_metrics(reference + torch.tensor([0.0, 0.5, -1.0]), reference)
    assert metrics["max_abs_err"] == 1.0
    assert metrics["mean_abs_err"] == pytest.approx(0.5)
    assert metrics["max_rel_err"] == pytest.approx(0.25)
    assert metrics["nonfinite"] == 0


def test_nonfinite_values_are_counted():
    reference = torch.zeros(4)
    metrics = tensor_metrics(torch.tensor([0.0, math.nan, math.inf, 0.0]), reference)
    assert metrics["nonfinite"] == 2
    assert not math.isfinite(metrics["max_abs_err"])


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="shape"):
        tensor_metrics(torch.zeros(2, 3), torch.zeros(3, 2))
