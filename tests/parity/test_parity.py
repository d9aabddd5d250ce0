"""The parity matrix as pytest items: `pytest --ref` captures references, plain `pytest` compares.

Test ids are case ids, e.g. `test_parity[flux/ulysses2/native/fp32/tensor]`.
"""

import pytest

from harness.errors import HarnessError
from harness.results import Status


def test_reference(captured_reference):
    from harness.reference import read_reference

    path, _written = captured_reference
    assert read_reference(path).output.isfinite().all(), f"{path}: the captured fp32 output is not finite"


def test_parity(parity_case, parity_results):
    if parity_case.skip_reason:
        pytest.skip(parity_case.skip_reason)
    if isinstance(parity_results, HarnessError):
        pytest.fail(str(parity_results), pytrace=False)
    result = parity_results[parity_case.case.case_id]
    if result.status is Status.SKIP:
        pytest.skip(result.reason)
    if result.status is Status.XFAIL:
        pytest.xfail(result.reason)
    if result.status.is_bad:
        numbers = ""
        if result.max_abs_err is not None:
            numbers = f" max_abs_err={result.max_abs_err:.3g} mean_abs_err={result.mean_abs_err:.3g} " \
                      f"tolerance={result.tolerance}"
        pytest.fail(f"{result.case_id}: {result.status.value}{numbers}: {result.reason}\n"
                    f"details: reports/results.json; rerun alone: harness run --models {result.model} "
                    f"--layouts {result.layout} --backends {result.backend} --dtypes {result.dtype}", pytrace=False)
    assert result.status is Status.PASS
