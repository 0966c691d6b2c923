"""The typed `Ops` module editors and type checkers read `ops.<name>(...)` from: kept
current with the contracts (like docs/contracts.md), and faithful to them."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path

import pytest

from accord.cli.main import main
from accord.op_contracts import CONTRACTS
from accord.op_contracts.spec import REQUIRED
from accord.op_contracts.stub import STUB_PATH, render_ops_stub
from accord.op_contracts.typed_ops import Ops

ROOT = Path(__file__).parents[2]


def test_the_typed_ops_module_is_current() -> None:
    published = (ROOT / STUB_PATH).read_text()
    assert published == render_ops_stub(CONTRACTS.values()), f"run: accord contracts --stub > {STUB_PATH}"


def test_accord_contracts_stub_prints_the_module(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["contracts", "--stub"]) == 0
    assert capsys.readouterr().out == (ROOT / STUB_PATH).read_text()


def test_there_is_one_method_per_contract() -> None:
    methods = {name for name, _ in inspect.getmembers(Ops, inspect.isfunction)}
    assert methods == set(CONTRACTS)


@pytest.mark.parametrize("op", CONTRACTS)
def test_each_method_takes_the_contracts_arguments_and_returns_its_outputs(op: str) -> None:
    contract = CONTRACTS[op]
    signature = inspect.signature(getattr(Ops, op))
    parameters = list(signature.parameters.values())[1:]  # self
    assert tuple(p.name for p in parameters) == contract.arg_names
    for param in contract.params:
        stub = signature.parameters[param.name]
        assert (stub.default is inspect.Parameter.empty) == (param.default is REQUIRED), param.name
        if param.default is not REQUIRED:
            assert stub.default == param.default, param.name
    for tensor in contract.tensors:
        default = signature.parameters[tensor.name].default
        assert default is inspect.Parameter.empty or (tensor.optional and default is None), tensor.name
    hints = typing.get_type_hints(getattr(Ops, op))
    returned = hints["return"]
    if not contract.outputs:
        assert returned is type(None)
    elif len(contract.outputs) == 1:
        assert returned.__name__ == "Tensor"
    else:
        assert len(typing.get_args(returned)) == len(contract.outputs)
    for param in contract.params:
        if param.choices is not None and param.type is str:
            assert typing.get_args(hints[param.name]) == param.choices, param.name


def test_the_dispatcher_is_annotated_with_the_typed_ops() -> None:
    # A type checker reads this branch; at run time the dispatcher must not inherit the
    # stub's methods, which would shadow the OpHandles `__getattr__` serves.
    from accord.op_contracts import dispatcher

    source = inspect.getsource(dispatcher)
    assert "from .typed_ops import Ops as _TypedOps" in source and "class OpDispatcher(_TypedOps):" in source
    assert not issubclass(dispatcher.OpDispatcher, Ops)


def test_accord_contracts_write_regenerates_both_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from accord.cli.commands import contracts
    from accord.op_contracts.render import render_reference

    (tmp_path / "docs").mkdir()
    (tmp_path / STUB_PATH).parent.mkdir(parents=True)
    monkeypatch.setattr(contracts, "CHECKOUT", tmp_path)
    assert main(["contracts", "--write"]) == 0
    assert (tmp_path / STUB_PATH).read_text() == render_ops_stub(CONTRACTS.values())
    assert (tmp_path / contracts.REFERENCE_PATH).read_text() == render_reference(CONTRACTS.values())
