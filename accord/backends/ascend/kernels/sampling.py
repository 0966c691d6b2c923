"""The sampler in plain torch on the NPU: torch-npu's fused samplers
(npu_top_k_top_p_sample) draw with their own random numbers, while the contract
defines the draw exactly (a CPU generator seeded per row), so no fused operator fits.
Filters run batched on the device; only the seeded uniforms are made on the host."""

from __future__ import annotations

import torch

from ....op_contracts import KernelSet

#: Rows with a temperature below this are greedy.
GREEDY_TEMPERATURE = 1e-5


def _renormalise(probs: torch.Tensor, keep: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """Rows with `active` set reduced to their `keep` entries and renormalised; other
    rows untouched (a filter that is off must not re-round its row)."""
    kept = probs.masked_fill(~keep, 0.0)
    return torch.where(active[:, None], kept / kept.sum(dim=-1, keepdim=True), probs)


def _filtered(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """The contract's top-k, top-p and min-p filters, in that order, on [n, V]."""
    vocab = probs.shape[1]
    ks = top_k.clamp(min=1, max=vocab).long()
    kth_largest = probs.sort(dim=-1, descending=True).values.gather(1, ks[:, None] - 1)
    probs = _renormalise(probs, probs >= kth_largest, top_k > 0)
    ordered, order = probs.sort(dim=-1, descending=True, stable=True)
    preceding = ordered.cumsum(dim=-1) - ordered
    keep = torch.empty_like(probs, dtype=torch.bool).scatter_(1, order, preceding < top_p[:, None])
    probs = _renormalise(probs, keep, top_p < 1.0)
    return _renormalise(probs, probs >= min_p[:, None] * probs.amax(dim=-1, keepdim=True), min_p > 0.0)


def _uniforms(seeds: list[int], vocab: int, device: torch.device) -> torch.Tensor:
    """The contract's per-row uniforms, drawn on the host from each row's seed."""
    rows = [torch.rand(vocab, generator=torch.Generator("cpu").manual_seed(seed)) for seed in seeds]
    return torch.stack(rows).to(device)


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    num_logprobs: int,
    token_ids: torch.Tensor,
    logprobs: torch.Tensor,
    top_logprobs: torch.Tensor,
    top_token_ids: torch.Tensor,
) -> None:
    """Greedy rows take the argmax; sampled rows race argmax(p / -log(u))."""
    rows = logits.float()
    torch.argmax(rows, dim=-1, out=token_ids)
    sampled = (temperature >= GREEDY_TEMPERATURE).nonzero().squeeze(1)
    if sampled.numel():
        probs = torch.softmax(rows.index_select(0, sampled) / temperature.index_select(0, sampled)[:, None], dim=-1)
        probs = _filtered(probs, top_k[sampled], top_p[sampled], min_p[sampled])
        uniform = _uniforms(seeds[sampled].tolist(), rows.shape[1], rows.device)
        token_ids.index_copy_(0, sampled, torch.argmax(probs / -torch.log(uniform), dim=-1))
    raw = torch.log_softmax(rows, dim=-1)
    logprobs.copy_(raw.gather(1, token_ids[:, None])[:, 0])
    if num_logprobs > 0:
        best = raw.topk(num_logprobs, dim=-1)
        top_logprobs.copy_(best.values)
        top_token_ids.copy_(best.indices)


def register(kernels: KernelSet) -> None:
    """Add the sampler, the rejection sampler and the multi-LoRA delta (they call no NPU
    operator; the latter two are the cpu backend's device-agnostic torch, the rejection
    sampler's uniforms made by the caller, the LoRA delta's GEMMs torch's matmuls)."""
    from ...cpu.kernels import KERNELS as CPU_KERNELS

    kernels.register("sample")(sample)
    kernels.add(CPU_KERNELS.get("rejection_sample"))
    kernels.add(CPU_KERNELS.get("lora_linear"))
