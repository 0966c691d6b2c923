"""What `NixlConnector`'s two instances tell each other, as plain data: the prefill
rank's registered cache (`NixlKVLayout`, published once by its worker half) and what
a decode instance needs to read one request's blocks (`RemoteKV`, carried in the
kv_transfer_params the router hands on, under vLLM's keys)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class RemoteTensor:
    """One registered cache tensor: its base address in the owner's memory and the
    shape of one token's entry (heads x head size, or MLA's latent width)."""

    address: int
    token_shape: tuple[int, ...]


@dataclass(frozen=True)
class NixlKVLayout:
    """A rank's cache as a remote reader addresses it: the NIXL agent's name, the host
    and port of its metadata listener, its KV spec (block size, dtype) and every layer's
    tensors in order, each [num_blocks, block_size, *token_shape], contiguous."""

    agent_name: str
    host: str
    port: int
    block_size: int
    dtype: str
    tensors: tuple[RemoteTensor, ...]

    @property
    def torch_dtype(self) -> torch.dtype:
        """The cache's dtype as torch's (the layout carries its name)."""
        dtype = getattr(torch, self.dtype.removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"NixlConnector: the remote KV dtype {self.dtype!r} is not a torch dtype")
        return dtype

    def bytes_per_block(self, tensor: RemoteTensor) -> int:
        """Bytes one block of `tensor` spans."""
        return self.block_size * math.prod(tensor.token_shape) * self.torch_dtype.itemsize

    def to_json(self) -> dict[str, Any]:
        """The layout as kv_transfer_params carry it (JSON: the router forwards it)."""
        return {
            "block_size": self.block_size,
            "dtype": self.dtype,
            "tensors": [[tensor.address, list(tensor.token_shape)] for tensor in self.tensors],
        }


@dataclass(frozen=True)
class RemoteKV:
    """Where one request's prompt KV lies on the prefill instance: its layout, the
    request's block ids there (from token 0), its id there (the read's notification
    names it) and how many prompt tokens the blocks hold."""

    layout: NixlKVLayout
    block_ids: tuple[int, ...]
    request_id: str
    num_tokens: int

    def to_params(self) -> dict[str, Any]:
        """vLLM's kv_transfer_params for the decode instance (plus the layout and token
        count, which vLLM exchanges in its own handshake)."""
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.layout.agent_name,
            "remote_host": self.layout.host,
            "remote_port": self.layout.port,
            "remote_block_ids": list(self.block_ids),
            "remote_request_id": self.request_id,
            "remote_num_tokens": self.num_tokens,
            "remote_kv_layout": self.layout.to_json(),
        }

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> RemoteKV:
        """The remote KV kv_transfer_params describe; ValueError names a missing or
        malformed key (a client wrote them, or another connector's instance)."""
        try:
            raw = params["remote_kv_layout"]
            layout = NixlKVLayout(
                agent_name=str(params["remote_engine_id"]),
                host=str(params["remote_host"]),
                port=int(params["remote_port"]),
                block_size=int(raw["block_size"]),
                dtype=str(raw["dtype"]),
                tensors=tuple(RemoteTensor(int(address), tuple(int(n) for n in shape)) for address, shape in raw["tensors"]),
            )
            remote = cls(
                layout=layout,
                block_ids=tuple(int(block) for block in params["remote_block_ids"]),
                request_id=str(params["remote_request_id"]),
                num_tokens=int(params["remote_num_tokens"]),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"NixlConnector: kv_transfer_params lack or garble a remote key ({error!r})") from error
        if remote.num_tokens > len(remote.block_ids) * layout.block_size:
            raise ValueError(
                f"NixlConnector: {remote.num_tokens} remote tokens do not fit {len(remote.block_ids)} "
                f"blocks of {layout.block_size}"
            )
        return remote
