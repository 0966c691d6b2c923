"""Manifold-constrained hyper-connections (mHC): `hc_mult` residual streams, collapsed
into a block's input and re-expanded from its output by weights a small fp32 projection
computes per token (the mixing matrix Sinkhorn-normalised to doubly stochastic).

Plain torch, not an op contract: per-token fp32 elementwise math and one skinny GEMM,
with no vendor kernel to dispatch to yet (docs/deepseek_v4.md)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _unweighted_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps)


class HyperConnection:
    """One block's mHC: (post, comb, collapsed input) from the streams, and the merge."""

    def __init__(
        self, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, streams: int, sinkhorn_iters: int,
        hc_eps: float, norm_eps: float,
    ) -> None:
        self.fn, self.base, self.scale = fn, base, scale
        self.streams = streams
        self.sinkhorn_iters = sinkhorn_iters
        self.hc_eps = hc_eps
        self.norm_eps = norm_eps

    def __call__(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """streams [T, N, H] -> (post [T, N], comb [T, N, N], collapsed [T, H])."""
        n = self.streams
        mixes = F.linear(_unweighted_rms(streams.flatten(1).float(), self.norm_eps), self.fn)
        pre_w, post_w, comb_w = mixes.split([n, n, n * n], dim=-1)
        pre_b, post_b, comb_b = self.base.split([n, n, n * n])
        pre_s, post_s, comb_s = self.scale.unbind(0)
        pre = torch.sigmoid(pre_w * pre_s + pre_b) + self.hc_eps
        post = 2 * torch.sigmoid(post_w * post_s + post_b)
        comb = torch.softmax(comb_w.view(-1, n, n) * comb_s + comb_b.view(n, n), dim=-1) + self.hc_eps
        comb = comb / (comb.sum(dim=-2, keepdim=True) + self.hc_eps)
        for _ in range(self.sinkhorn_iters - 1):
            comb = comb / (comb.sum(dim=-1, keepdim=True) + self.hc_eps)
            comb = comb / (comb.sum(dim=-2, keepdim=True) + self.hc_eps)
        collapsed = (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)
        return post, comb, collapsed

    @staticmethod
    def merge(post: torch.Tensor, comb: torch.Tensor, block_out: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
        """New streams: the block output spread by `post`, plus the old streams mixed by comb^T."""
        dtype = streams.dtype
        return post.to(dtype).unsqueeze(-1) * block_out.unsqueeze(1) + torch.matmul(
            comb.to(dtype).transpose(-1, -2), streams
        )


class HyperHead:
    """The final collapse of the streams before the model's norm and LM head."""

    def __init__(self, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, hc_eps: float, norm_eps: float) -> None:
        self.fn, self.base, self.scale = fn, base, scale
        self.hc_eps = hc_eps
        self.norm_eps = norm_eps

    def __call__(self, streams: torch.Tensor) -> torch.Tensor:
        """streams [T, N, H] -> [T, H]."""
        mixes = F.linear(_unweighted_rms(streams.flatten(1).float(), self.norm_eps), self.fn)
        pre = torch.sigmoid(mixes * self.scale + self.base) + self.hc_eps
        return (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)
