"""The communicators' dtype contracts: what each backend declares, refusals that name
the collective and dtype, adapters logged once and counted, gloo's table checked
against raw torch.distributed on this torch build, and the collective conformance
cases (zero-token ranks included) passing on 2 gloo ranks."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
import torch.distributed as dist

from accord.backends import default_registry
from accord.backends.communicator import COLLECTIVES, GLOO, CollectiveSupport, TorchCommunicator
from accord.conformance.collectives import collective_cases, run_case
from accord.conformance.ranks import spawn_ranks
from accord.op_contracts import ContractError

FP8 = torch.float8_e4m3fn


def test_backends_declare_their_communicator() -> None:
    registry = default_registry()
    expected = {"cpu": "gloo", "reference": "gloo", "triton": "gloo", "cuda": "nccl", "rocm": "rccl", "ascend": "hccl"}
    for name, communicator in expected.items():
        backend = registry.get(name, require_available=False)
        assert backend.dist_backend == communicator, name
        assert backend.collective_support().name == communicator, name
    # RCCL is reached through torch's "nccl" process group.
    assert registry.get("rocm", require_available=False).process_group_backend() == "nccl"


def test_gloo_declares_fp8_adapters() -> None:
    for collective in ("all_reduce", "reduce_scatter"):
        adapter = GLOO.plan(collective, FP8)
        assert adapter is not None and (adapter.kind, adapter.to) == ("upcast", torch.float32)
    for collective in ("all_gather", "all_to_all"):
        adapter = GLOO.plan(collective, FP8)
        assert adapter is not None and adapter.kind == "bytes"
    assert GLOO.plan("all_reduce", torch.bfloat16) is None


def test_undeclared_dtype_is_refused_by_name() -> None:
    no_fp8 = CollectiveSupport("strict", {c: frozenset({torch.float32}) for c in COLLECTIVES})
    with pytest.raises(ContractError) as refusal:
        no_fp8.plan("all_gather", FP8)
    assert (refusal.value.op, refusal.value.arg, refusal.value.backend) == ("collective.all_gather", "tensor", "strict")
    assert refusal.value.expected == "dtype in ['fp32']" and "fp8" in refusal.value.got
    with pytest.raises(ContractError, match="collective"):
        GLOO.plan("broadcast", torch.float32)


def _raw(collective: str, x: torch.Tensor) -> None:
    """The collective straight through torch.distributed, no contract in between."""
    if collective == "all_reduce":
        dist.all_reduce(x.clone())
    elif collective == "reduce_scatter":
        dist.reduce_scatter_tensor(torch.empty_like(x[: x.shape[0] // 2]), x.clone())
    elif collective == "all_gather":
        dist.all_gather_into_tensor(torch.empty((2 * x.shape[0], *x.shape[1:]), dtype=x.dtype), x)
    else:
        dist.all_to_all_single(torch.empty_like(x), x.clone())


def probe_rank(comm: TorchCommunicator) -> dict[str, Any]:
    """Runs in each spawned rank: raw gloo against the declared table, the adapter's
    logging and counting, and every collective conformance case."""
    carried, refused = {}, {}
    for collective in COLLECTIVES:
        for dtype in sorted(GLOO.native[collective], key=str):  # one order on every rank
            try:
                _raw(collective, torch.ones(4, 2).to(dtype))
                carried[collective, dtype] = True
            except Exception:
                carried[collective, dtype] = False
        try:
            _raw(collective, torch.ones(4, 2).to(FP8))
            refused[collective] = False
        except Exception:
            refused[collective] = True
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("accord.contracts").addHandler(handler)
    summed = [comm.all_reduce(torch.full((3,), 1.5).to(FP8)).float() for _ in range(2)]
    logging.getLogger("accord.contracts").removeHandler(handler)
    return {
        "carried": carried, "refused": refused, "adapter_logs": len(records), "counts": dict(comm.adapter_counts),
        "summed": summed, "cases": [run_case(comm, case, seed=0) for case in collective_cases()],
    }


@pytest.fixture(scope="module")
def probes() -> list[dict[str, Any]]:
    return spawn_ranks(probe_rank)


@pytest.mark.slow
def test_gloo_table_matches_this_torch_build(probes: list[dict[str, Any]]) -> None:
    for probe in probes:
        assert all(probe["carried"].values()), [k for k, ok in probe["carried"].items() if not ok]
        assert (torch.bfloat16 in GLOO.native["all_reduce"]) and probe["carried"]["all_reduce", torch.bfloat16]
        # What the table adapts, gloo really cannot carry: the adapter is needed.
        assert all(probe["refused"].values()), probe["refused"]


@pytest.mark.slow
def test_adapter_logged_once_and_counted(probes: list[dict[str, Any]]) -> None:
    for probe in probes:
        assert probe["adapter_logs"] == 1
        assert probe["counts"] == {"all_reduce.fp8e4m3fn->upcast": 2}
        assert all(torch.equal(s, torch.full((3,), 3.0)) for s in probe["summed"])


def test_collective_conformance_cases(probes: list[dict[str, Any]]) -> None:
    for probe in probes:
        failed = [(r.case, r.detail) for r in probe["cases"] if r.status == "failed"]
        assert not failed
        status = {r.case: r.status for r in probe["cases"]}
        assert status["all_gather[fp32,zero-rank]"] == "passed"
        assert status["all_to_all[bf16,zero-rank]"] == "passed"
        assert status["all_reduce[fp8e4m3fn,even]"] == "adapted"
        assert status["all_gather[fp8e4m3fn,zero-rank]"] == "adapted"
        assert status["all_reduce[complex64,even]"] == "refused"


def test_triton_under_the_interpreter_stays_on_the_cpu() -> None:
    """A rank of the interpreted triton backend binds no GPU and talks gloo."""
    triton = default_registry().get("triton", require_available=False)
    triton.select_device(1)  # must not touch torch.cuda on a host without one
    assert (triton.device_type, triton.process_group_backend()) == ("cpu", "gloo")
