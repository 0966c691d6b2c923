"""The reference backend is the golden: it must implement every contract."""

from accord.backends import get_backend
from accord.op_contracts import CONTRACTS


def test_every_contract_has_a_reference_kernel() -> None:
    missing = sorted(set(CONTRACTS) - set(get_backend("reference").kernels().ops()))
    assert missing == [], f"contracts without a reference kernel: {missing}"


def test_reference_has_no_kernel_without_a_contract() -> None:
    extra = sorted(set(get_backend("reference").kernels().ops()) - set(CONTRACTS))
    assert extra == [], f"reference kernels for unknown ops: {extra}"
