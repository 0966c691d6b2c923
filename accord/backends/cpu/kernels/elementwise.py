"""Per-token kernels: RMS norm (plain and with the fused residual add), rotary
embedding and SiLU-and-mul. Each is one call into elementwise.c where it is built (fp32
and bf16); otherwise, and for fp16, the torch path below: fp32 runs straight into the
output buffers, bf16/fp16 compute in an fp32 temporary and round once on the final
copy, as the contracts say."""

from __future__ import annotations

import torch

from . import _native_elementwise as native
from ._registry import KERNELS


def _eps_tensor(eps: float) -> torch.Tensor:
    """eps as a 0-dim fp32 tensor, made once per value: a Python scalar operand costs
    torch a wrapped tensor on every call (several microseconds at decode sizes)."""
    tensor = _EPS_TENSORS.get(eps)
    if tensor is None:
        with torch.inference_mode(False):
            tensor = _EPS_TENSORS[eps] = torch.tensor(eps, dtype=torch.float32)
    return tensor


_EPS_TENSORS: dict[float, torch.Tensor] = {}


def _rms_norm_into(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """out = x * rsqrt(mean(x^2) + eps) * weight, in fp32, rounded once to out's dtype."""
    x32 = x.float()
    # vector_norm reduces without materialising x^2: mean(x^2) + eps = eps + |x|^2 / H,
    # one addcmul (the ops at decode sizes cost their dispatch, not their arithmetic).
    norm = torch.linalg.vector_norm(x32, dim=-1, keepdim=True)
    inv_rms = torch.addcmul(_eps_tensor(eps), norm, norm, value=1.0 / x.shape[-1]).rsqrt_()
    if out.dtype == torch.float32:
        torch.mul(x32, inv_rms, out=out)
        out.mul_(weight)
    else:
        out.copy_(torch.mul(x32, inv_rms).mul_(weight.float()))


@KERNELS.register("rms_norm")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """Llama's RMSNorm, one fused pass per row."""
    if not native.rms_norm(x, None, weight, eps, out, None):
        _rms_norm_into(x, weight, eps, out)


@KERNELS.register("fused_add_rms_norm")
def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor,
    residual_out: torch.Tensor,
) -> None:
    """residual_out = x + residual (torch adds bf16 in fp32 and rounds once), then the
    norm of that stored sum."""
    if native.rms_norm(x, residual, weight, eps, out, residual_out):
        return
    torch.add(x, residual, out=residual_out)
    _rms_norm_into(residual_out, weight, eps, out)


def _pairs(x: torch.Tensor, is_neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The two halves of each rotated pair as views: neox splits the rotary dims in
    halves, gpt-j interleaves them."""
    if is_neox:
        half = x.shape[-1] // 2
        return x[..., :half], x[..., half:]
    return x[..., 0::2], x[..., 1::2]


def _rotate(source: torch.Tensor, target: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> None:
    """Rotate the first R dims of every head of `source` into `target`; copy the rest."""
    rotary_dim = cos.shape[-1] * 2
    if rotary_dim < source.shape[-1]:
        target[..., rotary_dim:] = source[..., rotary_dim:]
    rotated = target[..., :rotary_dim]
    result = rotated if target.dtype == torch.float32 else torch.empty(rotated.shape, dtype=torch.float32)
    first, second = _pairs(source[..., :rotary_dim].float(), is_neox)
    new_first, new_second = _pairs(result, is_neox)
    torch.mul(first, cos, out=new_first).addcmul_(second, sin, value=-1.0)
    torch.mul(second, cos, out=new_second).addcmul_(first, sin)
    if result is not rotated:
        rotated.copy_(result)


#: The signs of sin in the neox rotation's halves: (a, b) -> (a*cos - b*sin, b*cos + a*sin).
_NEOX_SIN_SIGNS = torch.tensor([[-1.0], [1.0]])


def _rotate_neox(source: torch.Tensor, target: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> None:
    """Whole-head neox rotation of fp32 `source` [T, H, D] into fp32 `target`, each head
    seen as its two halves [2, D/2]: cos [T, 1, 1, D/2] and signed_sin [T, 1, 2, D/2]
    (-sin, sin) broadcast over them, against the halves swapped."""
    tokens, heads, dim = source.shape
    halves = (tokens, heads, 2, dim // 2)
    swapped = torch.cat([source[..., dim // 2 :], source[..., : dim // 2]], -1).view(halves)
    torch.mul(source.view(halves), cos, out=target.view(halves)).addcmul_(swapped, signed_sin)


@KERNELS.register("rotary_embedding")
def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    query_out: torch.Tensor,
    key_out: torch.Tensor,
) -> None:
    """Rotary position embedding of query and key (neox or gpt-j pairs, partial R)."""
    if native.rotary_embedding(positions, query, key, cos_sin_cache, is_neox, query_out, key_out):
        return
    table = cos_sin_cache.index_select(0, positions)
    half = cos_sin_cache.shape[1] // 2
    if is_neox and 2 * half == query.shape[-1] and query_out.dtype == torch.float32:
        # The common case (whole-head neox in fp32, Llama and Qwen here) in few ops:
        # at decode sizes each op costs its dispatch, not its arithmetic.
        signed_sin = torch.mul(table[:, None, half:], _NEOX_SIN_SIGNS)[:, None]
        cos = table[:, None, None, :half]
        _rotate_neox(query, query_out, cos, signed_sin)
        _rotate_neox(key, key_out, cos, signed_sin)
        return
    cos, sin = table[:, None, :half], table[:, None, half:]
    _rotate(query, query_out, cos, sin, is_neox)
    _rotate(key, key_out, cos, sin, is_neox)


@KERNELS.register("silu_and_mul")
def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> None:
    """SwiGLU: silu(gate) * up, written into out without a temporary for fp32."""
    if native.silu_and_mul(x, out):
        return
    intermediate = x.shape[1] // 2
    gate, up = x[:, :intermediate], x[:, intermediate:]
    if out.dtype == torch.float32:
        # The out= form F.silu lacks; torch.ops.aten.silu.out reaches the same kernel
        # through a Python-level overload call, several microseconds more per call.
        torch._C._nn.silu(gate, out=out)
        out.mul_(up)
    else:
        activated = torch.nn.functional.silu(gate.float(), inplace=True).mul_(up)
        out.copy_(activated)
