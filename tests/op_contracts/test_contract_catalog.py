"""The contract catalog is well-formed and its published reference is current."""

from __future__ import annotations

from pathlib import Path

import pytest

from accord.op_contracts import CONTRACTS, INDEX_DTYPES
from accord.op_contracts.render import render_reference
from accord.op_contracts.shapes import parse_dim

DESIGN_OP_SET = {
    "rms_norm", "fused_add_rms_norm", "rotary_embedding", "silu_and_mul", "reshape_and_cache",
    "concat_and_cache_mla", "paged_attention", "mla_attention", "moe_route", "fused_moe",
    "quantize_fp8", "scaled_mm", "sample",
}


def test_catalog_covers_the_design_op_set():
    assert DESIGN_OP_SET <= CONTRACTS.keys()


@pytest.mark.parametrize("contract", CONTRACTS.values(), ids=lambda c: c.name)
def test_every_dimension_parses_and_groups_name_real_tensors(contract):
    tensor_names = {t.name for t in contract.tensors}
    for group in contract.dtype_groups:
        assert set(group) <= tensor_names
    for spec in (*contract.tensors, *contract.outputs):
        shapes = spec.shape.cases.values() if hasattr(spec.shape, "cases") else [spec.shape]
        for shape in shapes:
            for dim in shape:
                parse_dim(dim)


@pytest.mark.parametrize("contract", CONTRACTS.values(), ids=lambda c: c.name)
def test_index_tensors_admit_only_integer_dtypes(contract):
    for spec in contract.tensors:
        if spec.index:
            assert set(spec.dtypes) <= set(INDEX_DTYPES)


def test_docs_contract_reference_is_current():
    published = (Path(__file__).parents[2] / "docs" / "contracts.md").read_text()
    assert published == render_reference(CONTRACTS.values()), "run: accord contracts > docs/contracts.md"
