"""The parity matrix as pytest items: `pytest --ref` captures references, plain `pytest` compares.

Test ids are case ids, e.g. `test_parity[flux/ulysses2/native/fp32/tensor]`; the plugin provides the cases, the
shared matrix run and the outcome of each (a user's project needs only these two functions).
"""

import pytest

from harness.plugin import check_parity, check_reference

pytestmark = pytest.mark.slow  # the quick plan's matrix: torchrun launches, minutes (the fast tier leaves it out)


def test_reference(captured_reference):
    check_reference(captured_reference)


def test_parity(parity_case, parity_results):
    check_parity(parity_case, parity_results)
