"""Reading a pickled PyTorch state dict (`pytorch_model.bin`), the layout the public
EAGLE-1 heads ship in. Only `torch.load(weights_only=True)` opens it: PyTorch's
restricted unpickler, which builds tensors and plain containers and refuses any other
object, so loading it runs no code of the file's. Model directories in general stay
safetensors-only (hf_checkpoint); this reader serves the speculative heads alone."""

from __future__ import annotations

from pathlib import Path

import torch

from .hf_checkpoint import CheckpointError, TrackedTensorNames

PICKLED_STATE_DICT = "pytorch_model.bin"


class TorchBinCheckpoint(TrackedTensorNames):
    """The tensors of one `pytorch_model.bin`, read into memory at once (a head is one
    layer), with the same reading interface as SafetensorsCheckpoint, used names tracked."""

    def __init__(self, model_dir: str | Path) -> None:
        path = Path(model_dir) / PICKLED_STATE_DICT
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # the restricted unpickler's refusals have no one type
            raise CheckpointError(f"{path}: not a state dict torch.load(weights_only=True) can read: {error}") from None
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise CheckpointError(f"{path}: holds no plain state dict (name -> tensor)")
        self._tensors: dict[str, torch.Tensor] = state
        super().__init__(model_dir, self._tensors.keys())

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's stored shape."""
        return tuple(self._tensors[name].shape)

    def read(self, name: str) -> torch.Tensor:
        """A tensor as stored (dtype unchanged), marked as used."""
        self._mark_read(name)
        return self._tensors[name]

    def read_slice(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of a tensor along `dim`, marked as used."""
        return self.read(name).narrow(dim, start, stop - start)


def head_checkpoint(model_dir: Path):
    """A speculative head's tensors: its safetensors when it has them, else its
    `pytorch_model.bin` (read with the restricted unpickler)."""
    from .hf_checkpoint import SafetensorsCheckpoint

    if (model_dir / PICKLED_STATE_DICT).is_file() and not any(model_dir.glob("*.safetensors*")):
        return TorchBinCheckpoint(model_dir)
    return SafetensorsCheckpoint(model_dir)
