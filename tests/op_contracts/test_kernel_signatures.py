"""Kernels are checked against their contract when they are registered: a kernel must
take exactly the contract's argument and output names (the dispatcher calls it by
keyword), and every built-in backend's table passes that check."""

from __future__ import annotations

from typing import Any

import pytest

from accord.backends.ascend import AscendBackend
from accord.backends.base import Backend
from accord.backends.cpu import CpuBackend
from accord.backends.cuda import CudaBackend
from accord.backends.reference import ReferenceBackend
from accord.backends.rocm import RocmBackend
from accord.backends.triton import TritonBackend
from accord.op_contracts import CONTRACTS, Kernel, KernelSet
from accord.op_contracts.kernel import KernelSignatureError, kernel_parameter_names, signature_mismatch


def gpu_backend(cls: type[Backend], architecture: str) -> Backend:
    """A GPU backend whose kernel table can be built on a host without its GPU: the
    architecture (read from the device otherwise) is given."""
    backend = cls()
    backend.__dict__["architecture"] = architecture
    return backend


BUILT_IN = {
    "reference": ReferenceBackend,
    "cpu": CpuBackend,
    "triton": TritonBackend,
    "cuda": lambda: gpu_backend(CudaBackend, "sm_90"),
    "rocm-gfx942": lambda: gpu_backend(RocmBackend, "gfx942"),
    "ascend": lambda: AscendBackend(emulate=True),
}


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_built_in_kernel_takes_exactly_its_contracts_names(name: str) -> None:
    kernels = BUILT_IN[name]().load_kernels()  # registration itself raises on a mismatch
    assert set(kernels.ops()) == set(CONTRACTS)
    for op, kernel in kernels.as_dict().items():
        assert signature_mismatch(CONTRACTS[op], kernel.fn) is None, (name, op)


def rms_norm_with_renamed_eps(x: Any, weight: Any, epsilon: float, out: Any) -> None:
    """A kernel whose author spelt the parameter `epsilon`: the dispatcher would pass
    `eps=` and crash mid-step."""
    out.copy_(x)


def test_a_renamed_argument_is_refused_at_registration_naming_backend_op_and_names() -> None:
    kernels = KernelSet("broken")
    with pytest.raises(KernelSignatureError) as info:
        kernels.register("rms_norm")(rms_norm_with_renamed_eps)
    message = str(info.value)
    assert "backend 'broken'" in message and "rms_norm kernel" in message
    assert "missing eps" in message and "extra epsilon" in message
    assert kernels.get("rms_norm") is None


def test_a_kernel_without_an_output_parameter_is_refused() -> None:
    def fused_add_rms_norm(x: Any, residual: Any, weight: Any, eps: float, out: Any) -> None:
        out.copy_(x)

    with pytest.raises(KernelSignatureError, match="missing residual_out"):
        KernelSet("broken").register("fused_add_rms_norm")(fused_add_rms_norm)


def test_an_added_kernel_is_checked_too() -> None:
    with pytest.raises(KernelSignatureError, match="backend 'broken'.*extra epsilon"):
        KernelSet("broken").add(Kernel("rms_norm", rms_norm_with_renamed_eps))


def test_a_kernel_for_an_op_without_a_contract_is_refused() -> None:
    with pytest.raises(KernelSignatureError, match="'rms_norm2', which no op contract defines"):
        KernelSet("broken").register("rms_norm2")(rms_norm_with_renamed_eps)


def test_positional_only_parameters_are_refused() -> None:
    def silu_and_mul(x: Any, /, out: Any) -> None:
        out.copy_(x)

    with pytest.raises(KernelSignatureError, match="missing x; positional-only x"):
        KernelSet("broken").register("silu_and_mul")(silu_and_mul)


def test_a_forwarding_wrapper_takes_every_name_but_may_not_name_an_extra_one() -> None:
    correct = ReferenceBackend().kernels().get("rms_norm")
    assert correct is not None
    KernelSet("wrapper").add(Kernel("rms_norm", lambda **call: correct.fn(**call)))

    def wrapper(flag: bool = False, **call: Any) -> None:
        correct.fn(**call)

    with pytest.raises(KernelSignatureError, match="extra flag"):
        KernelSet("wrapper").add(Kernel("rms_norm", wrapper))


def test_the_parameter_names_are_the_contracts_arguments_then_outputs() -> None:
    contract = CONTRACTS["fused_add_rms_norm"]
    assert kernel_parameter_names(contract) == ("x", "residual", "weight", "eps", "out", "residual_out")
