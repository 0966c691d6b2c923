"""What `--backend auto` asks of a backend for a W4A16 checkpoint: group_quant_linear
joins the ops config.json alone implies (`worker_contract_ops`), and they are the ops a
worker's profile run of it really calls."""

from __future__ import annotations

from pathlib import Path

from compressed_tensors_writer import quantization_config, quantiser, scheme
from group_quant_models import save_tiny_llama, write_pair
from test_models_contract_ops import recorded_graph_ops

from accord.core.worker.contract_ops import SAMPLER_OPS, worker_contract_ops


def test_a_w4a16_checkpoint_declares_group_quant_linear_and_calls_what_it_declares(tmp_path: Path) -> None:
    source = save_tiny_llama(tmp_path / "fp32")
    packed, dense = tmp_path / "packed", tmp_path / "dense"
    write_pair(source, packed, dense, quantiser(scheme(4, True, 128)), quantization_config(4, True, 128))
    assert "group_quant_linear" in worker_contract_ops(packed)
    assert "group_quant_linear" not in worker_contract_ops(dense)
    assert recorded_graph_ops(packed, tmp_path / "calls") == worker_contract_ops(packed) - SAMPLER_OPS
