"""The cuda and rocm plugins: they import and report unavailable (with the reason) on a
host without their GPUs, pick the fp8 format from the device architecture, convert
e4m3fn weights for e4m3fnuz devices without changing their values, refuse the fp8
format their device does not compute in, and fall back from torch._scaled_mm to the
Triton kernel where the call does not fit it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from accord.backends import default_registry
from accord.backends.triton.device import e4m3fn_to_e4m3fnuz, fp8_dtype_for_architecture, restrict_fp8
from accord.backends.triton.torch_fast_paths import scaled_mm_with_torch
from accord.op_contracts import ContractError, Kernel, KernelSet, OpDispatcher

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the plugins are available here")


@dataclass
class _KernelTable:
    """A minimal backend for the dispatcher: given kernels, on the CPU."""

    kernels: KernelSet
    name: str = "test-gpu"
    device_type: str = "cpu"

    def kernel_for(self, op: str) -> Kernel | None:
        return self.kernels.get(op)


@no_gpu
@pytest.mark.parametrize("name", ["cuda", "rocm"])
def test_gpu_plugins_report_unavailable_with_a_reason_on_a_host_without_their_gpu(name):
    availability = default_registry().get(name, require_available=False).availability()
    assert not availability.available and availability.reason


@pytest.mark.parametrize("name, dist_backend", [("cuda", "nccl"), ("rocm", "rccl")])
def test_gpu_plugins_name_their_distributed_backend(name, dist_backend):
    assert default_registry().get(name, require_available=False).dist_backend == dist_backend


@pytest.mark.parametrize(
    "architecture, fp8_dtype",
    [("gfx942", torch.float8_e4m3fnuz), ("gfx940", torch.float8_e4m3fnuz), ("gfx950", torch.float8_e4m3fn),
     ("gfx90a", torch.float8_e4m3fn), ("sm_90", torch.float8_e4m3fn), ("sm_89", torch.float8_e4m3fn)],
)
def test_fp8_format_follows_the_device_architecture(architecture, fp8_dtype):
    assert fp8_dtype_for_architecture(architecture) == fp8_dtype


def test_e4m3fn_weights_convert_to_e4m3fnuz_with_the_same_dequantised_values():
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    finite = ~torch.isnan(codes.float())
    scale = torch.tensor(0.75)
    converted, converted_scale = e4m3fn_to_e4m3fnuz(codes, scale)
    assert converted.dtype == torch.float8_e4m3fnuz
    assert torch.equal(converted.float()[finite] * converted_scale, codes.float()[finite] * scale)


def test_e4m3fn_negative_zero_converts_to_zero_not_nan():
    converted, _ = e4m3fn_to_e4m3fnuz(torch.tensor([0x80], dtype=torch.uint8).view(torch.float8_e4m3fn), torch.tensor(1.0))
    assert converted.float().item() == 0.0


@pytest.mark.parametrize("architecture, stored", [("gfx942", torch.float8_e4m3fnuz), ("gfx950", torch.float8_e4m3fn)])
def test_rocm_converts_checkpoint_fp8_weights_at_load_time_only_for_an_e4m3fnuz_device(architecture, stored):
    backend = type(default_registry().get("rocm", require_available=False))()
    backend.__dict__["architecture"] = architecture  # as read from the device at run time
    weight, scale = backend.prepare_fp8_weight(torch.tensor([[1.5, -0.25]]).to(torch.float8_e4m3fn), torch.tensor(2.0))
    assert weight.dtype == stored
    assert torch.equal(weight.float() * scale, torch.tensor([[3.0, -0.5]]))


@pytest.fixture
def fnuz_device_ops(triton_ops) -> OpDispatcher:
    """The Triton kernels as an e4m3fnuz device (MI300) restricts them."""
    from accord.backends.triton.kernels import KERNELS

    return OpDispatcher(_KernelTable(restrict_fp8(KERNELS, torch.float8_e4m3fnuz)), strict=True)


def test_a_gpu_refuses_fp8_tensors_of_the_format_it_does_not_compute_in(fnuz_device_ops):
    a = torch.ones(4, 16).to(torch.float8_e4m3fn)
    with pytest.raises(ContractError, match="computes fp8 as fp8e4m3fnuz"):
        fnuz_device_ops.scaled_mm(a, a, torch.ones(1, 1), torch.ones(1, 1))


def test_a_gpu_refuses_to_quantize_to_the_fp8_format_it_does_not_compute_in(fnuz_device_ops):
    with pytest.raises(ContractError, match="computes fp8 as fp8e4m3fnuz"):
        fnuz_device_ops.quantize_fp8(torch.ones(2, 8), fp8_dtype=torch.float8_e4m3fn)


def test_a_gpu_runs_its_own_fp8_format(fnuz_device_ops):
    q, _ = fnuz_device_ops.quantize_fp8(torch.ones(2, 8), fp8_dtype=torch.float8_e4m3fnuz)
    assert q.dtype == torch.float8_e4m3fnuz


def test_scaled_mm_fast_path_falls_back_to_the_triton_kernel_off_the_gpu(triton_ops, reference_ops):
    from accord.backends.triton.kernels import KERNELS

    kernels = KernelSet()
    kernels.add(scaled_mm_with_torch(KERNELS.get("scaled_mm"), "sm_90"))
    ops = OpDispatcher(_KernelTable(kernels), strict=True)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 32, generator=g).to(torch.float8_e4m3fn), torch.randn(16, 32, generator=g).to(torch.float8_e4m3fn)
    scales = torch.tensor([[0.5]]), torch.tensor([[2.0]])
    torch.testing.assert_close(ops.scaled_mm(a, b, *scales), reference_ops.scaled_mm(a, b, *scales))


def test_the_triton_kernel_table_covers_every_contract_so_auto_can_choose_a_gpu_backend():
    # `--backend auto` passes over a backend with any contract missing: without these
    # kernels a GPU host would be served by the cpu backend.
    from accord.backends.registry import missing_kernels

    assert missing_kernels(default_registry().get("triton", require_available=False)) == []


def test_the_borrowed_sampler_draws_on_the_host_so_every_device_gets_the_contracts_draw():
    from accord.backends.reference.kernels import KERNELS as REFERENCE
    from accord.backends.triton.kernels import KERNELS as TRITON

    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    args = dict(
        temperature=torch.tensor([0.0, 0.7, 1.0, 1.3]),
        top_k=torch.tensor([0, 5, 0, 10], dtype=torch.int32),
        top_p=torch.tensor([1.0, 1.0, 0.9, 0.8]),
        min_p=torch.tensor([0.0, 0.0, 0.0, 0.05]),
        seeds=torch.tensor([1, 2, 3, 4], dtype=torch.int64),
        num_logprobs=0,
    )
    outputs = []
    for table in (TRITON, REFERENCE):
        out = dict(
            token_ids=torch.empty(4, dtype=torch.int64),
            logprobs=torch.empty(4),
            top_logprobs=torch.empty(4, 0),
            top_token_ids=torch.empty(4, 0, dtype=torch.int64),
        )
        table.get("sample").fn(logits=logits, **args, **out)
        outputs.append(out["token_ids"])
    assert torch.equal(outputs[0], outputs[1])
