"""The ops every OpDispatcher serves, typed. Generated from accord/op_contracts/contracts/
by `accord contracts --stub`; do not edit by hand (tests/op_contracts keeps it current).

Type checkers and editors see `OpDispatcher` as a subclass of `Ops` (dispatcher.py
says so under TYPE_CHECKING), so `ops.rms_norm(...)` resolves to the method here, with
the contract's signature and doc. At run time the dispatcher serves each op through an
`OpHandle` and this class is never used.
"""

from __future__ import annotations

from typing import Literal

import torch


class Ops:
    """Every op contract as a method: tensors, then parameters, in contract order;
    outputs are allocated by the dispatcher and returned."""

    def rms_norm(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float = 1e-06,
    ) -> torch.Tensor:
        """out = x * rsqrt(mean(x^2, -1) + eps) * weight, the mean taken in fp32, the product rounded
        once to x's dtype (Llama's RMSNorm).

        x: fp32/fp16/bf16 [T, H]: activations, one row per token
        weight: fp32/fp16/bf16 [H]: per-channel gain
        eps: added to the mean square
        returns out: like:x [T, H]
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def fused_add_rms_norm(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float = 1e-06,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """residual_out = x + residual (added in fp32, stored in x's dtype); out =
        rms_norm(residual_out) as rms_norm defines it. The pre-norm block's seam.

        x: fp32/fp16/bf16 [T, H]: the sub-layer's output
        residual: fp32/fp16/bf16 [T, H]: the running residual stream
        weight: fp32/fp16/bf16 [H]: per-channel gain
        returns out: like:x [T, H]: normalised sum
        returns residual_out: like:x [T, H]: x + residual
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def rotary_embedding(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        is_neox: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotates the first R dims of every head of query and key by the angle table row of each
        token's position; dims past R pass through (partial rotary, as MLA's decoupled rope uses).
        cos = cos_sin_cache[pos, :R/2], sin = cos_sin_cache[pos, R/2:]. neox layout pairs dim i with
        i+R/2; gpt-j layout pairs 2i with 2i+1. For each pair (a, b): (a*cos - b*sin, b*cos +
        a*sin), computed in fp32 and rounded once.

        positions: int32/int64 [T]: absolute position of each token
        query: fp32/fp16/bf16 [T, Hq, D]
        key: fp32/fp16/bf16 [T, Hk, D]
        cos_sin_cache: fp32 [P, R]: cos|sin halves per position
        is_neox: neox (True) or gpt-j layout
        returns query_out: like:query [T, Hq, D]
        returns key_out: like:key [T, Hk, D]
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def silu_and_mul(
        self,
        x: torch.Tensor,
    ) -> torch.Tensor:
        """out = silu(x[:, :I]) * x[:, I:], computed in fp32 and rounded once (SwiGLU).

        x: fp32/fp16/bf16 [T, 2*I]: gate and up projections side by side
        returns out: like:x [T, I]
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        out_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """out = x @ weight^T (+ bias), accumulated in at least fp32 and rounded once to out_dtype: x's
        dtype, or fp32 from bf16/fp16 operands (the LM head's logits, which sampling, logprobs and
        token masks read, so a half-precision rounding never ties two tokens). `weight` is what
        Backend.prepare_linear_weight returned at load: the backend may hold it in an opaque,
        prepacked layout (oneDNN's blocked format on CPUs), so only the backend that prepared a
        weight may be handed it; its logical shape and dtype are those of the [N, K] checkpoint
        matrix.

        x: fp32/fp16/bf16 [T, K]: activations, one row per token
        weight: fp32/fp16/bf16 [N, K]: the weight, as the backend prepared it
        bias: fp32/fp16/bf16 [N]: per-output-channel bias
        out_dtype: the output's, where not x's
        returns out: param:out_dtype|like:x [T, N]
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def lora_linear(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        slot_ids: torch.Tensor,
    ) -> torch.Tensor:
        """out[t] = y[t] + (x[t] @ lora_a[s]^T) @ lora_b[s] with s = slot_ids[t], and out[t] = y[t]
        where s = -1 (the base model). `y` is the base projection of `x` (ops.linear, once for the
        batch); `lora_a` [S, R, K] (PEFT's A) and `lora_b` [S, R, N] (PEFT's B transposed, so the
        expand reads each rank's row of N outputs contiguously) hold the adapters resident in the S
        device slots, padded with zeros to the slots' rank R, the adapter's scaling already folded
        into lora_b. A slot no row names may hold anything. Both products are accumulated in at
        least fp32 and the sum with y is rounded once to y's dtype. slot_ids values lie in [-1, S).

        y: fp32/fp16/bf16 [T, N]: the base projection's output
        x: fp32/fp16/bf16 [T, K]: the projection's input activations
        lora_a: fp32/fp16/bf16 [S, R, K]: each slot's A (down) matrix
        lora_b: fp32/fp16/bf16 [S, R, N]: each slot's B (up) matrix transposed, times the scaling
        slot_ids: int32 [T]: each token's adapter slot, -1 for none
        returns out: like:y [T, N]
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def quant_linear(
        self,
        x: torch.Tensor,
        qweight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        quant_type: Literal['Q8_0', 'Q4_0', 'Q4_1', 'Q5_0', 'Q5_1', 'Q2_K', 'Q3_K', 'Q4_K', 'Q5_K', 'Q6_K'],
        out_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """out = x @ dequantise(qweight, quant_type)^T (+ bias), accumulated in at least fp32 and
        rounded once to out_dtype (x's dtype, or fp32 for the LM head). qweight [N, K / block_size *
        block_bytes] holds each output row's GGUF blocks as ggml lays them out; dequantise is the
        format's definition (ggml-quants.c's dequantize_row_*). A kernel may quantise x to int8 per
        32-wide block (ggml's Q8 activations): the tolerance allows for it.

        x: fp32/fp16/bf16 [T, K]: activations, one row per token
        qweight: uint8 [N, B]: each row's GGUF blocks, as ggml lays them out
        bias: fp32/fp16/bf16 [N]: per-output-channel bias
        quant_type: the GGUF block format
        out_dtype: the output's, where not x's
        returns out: param:out_dtype|like:x [T, N]
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def quant_embedding(
        self,
        ids: torch.Tensor,
        qweight: torch.Tensor,
        quant_type: Literal['Q8_0', 'Q4_0', 'Q4_1', 'Q5_0', 'Q5_1', 'Q2_K', 'Q3_K', 'Q4_K', 'Q5_K', 'Q6_K'],
        hidden_size: int,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        """out[t] = dequantise(qweight[ids[t]], quant_type), each looked-up row dequantised by its
        format's definition (as quant_linear's) and rounded once to out_dtype: a GGUF token
        embedding read in its blocks, so a model whose LM head shares the table holds it once. Every
        id must name a row of qweight.

        ids: int32/int64 [T]: token ids, rows of qweight
        qweight: uint8 [V, B]: each row's GGUF blocks, as ggml lays them out
        quant_type: the GGUF block format
        hidden_size: weights a row (a whole number of blocks)
        out_dtype: the rows' dtype
        returns out: param:out_dtype [T, hidden_size]
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def group_quant_linear(
        self,
        x: torch.Tensor,
        qweight: torch.Tensor,
        scales: torch.Tensor,
        zeros: torch.Tensor | None = None,
        g_idx: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        *,
        bits: Literal[4, 8],
        group_size: int,
        out_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """out = x @ W^T (+ bias), W[n, k] = (code[n, k] - zero[n, g]) * scale[n, g] with g = g_idx[k]
        where given, else k // group_size (0 for group_size -1), accumulated in at least fp32 and
        rounded once to out_dtype (x's dtype, or fp32 for the LM head). qweight [N, cdiv(K*bits,
        32)] int32 packs each row's unsigned codes along K, code k at bit k*bits of the row
        (compressed-tensors' pack_to_int32 layout); zeros absent means symmetric (zero 2**(bits-1)).
        K need not be a multiple of group_size. A kernel may dequantise W to x's dtype: the
        tolerance allows for it.

        x: fp32/fp16/bf16 [T, K]: activations, one row per token
        qweight: int32 [N, P]: each output row's codes, packed along K
        scales: fp32/fp16/bf16 [N, G]: each group's scale
        zeros: uint8 [N, G]: each group's zero point (asymmetric)
        g_idx: int32 [K]: each input channel's group (act-order)
        bias: fp32/fp16/bf16 [N]: per-output-channel bias
        bits: bits per code
        group_size: input channels per group; -1: one group a row
        out_dtype: the output's, where not x's
        returns out: param:out_dtype|like:x [T, N]
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def reshape_and_cache(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
    ) -> None:
        """For each token t with slot s = slot_mapping[t] >= 0: key_cache[s // BS, s % BS] = key[t] and
        value_cache likewise; a negative slot is padding and is skipped. An fp8 cache stores key /
        k_scale and value / v_scale, saturated to the fp8 range.

        key: fp32/fp16/bf16 [T, Hk, D]
        value: fp32/fp16/bf16 [T, Hk, D]
        key_cache: fp32/fp16/bf16/fp8e4m3fn/fp8e4m3fnuz [NB, BS, Hk, D] (written in place)
        value_cache: fp32/fp16/bf16/fp8e4m3fn/fp8e4m3fnuz [NB, BS, Hk, D] (written in place)
        slot_mapping: int32/int64 [T]: flat cache slot per token, -1 skips
        returns None: writes its in-place arguments
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def concat_and_cache_mla(
        self,
        kv_c: torch.Tensor,
        k_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        scale: float = 1.0,
    ) -> None:
        """MLA's latent cache writer: for each token t with slot s >= 0, kv_cache[s // BS, s % BS] =
        concat(kv_c[t], k_pe[t]) (divided by scale into an fp8 cache); a negative slot is skipped.

        kv_c: fp32/fp16/bf16 [T, L]: compressed latent KV (normed)
        k_pe: fp32/fp16/bf16 [T, R]: rotated decoupled rope key
        kv_cache: fp32/fp16/bf16/fp8e4m3fn/fp8e4m3fnuz [NB, BS, L+R] (written in place)
        slot_mapping: int32/int64 [T]
        returns None: writes its in-place arguments
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def paged_attention(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        scale: float,
        sliding_window: int = 0,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
    ) -> torch.Tensor:
        """Varlen causal attention over the paged cache, one call for prefill chunks and decodes alike:
        out[t, h] = softmax(scale * q[t, h] . K_b^T) V_b over the cached positions row t may see,
        with kv head h // (Hq / Hk) (GQA). With sliding_window w > 0, row at position q sees
        positions p with q - p < w. An fp8 cache is read as stored * k_scale (v_scale). Softmax in
        fp32.

        query: fp32/fp16/bf16 [T, Hq, D]
        key_cache: fp32/fp16/bf16/fp8e4m3fn/fp8e4m3fnuz [NB, BS, Hk, D]
        value_cache: fp32/fp16/bf16/fp8e4m3fn/fp8e4m3fnuz [NB, BS, Hk, D]
        block_tables: int32/int64 [B, MB]: physical block of each logical block
        seq_lens: int32/int64 [B]: cached tokens per sequence, new ones included
        query_start_loc: int32/int64 [B+1]: prefix sum of query lengths
        scale: softmax scale, usually D ** -0.5
        sliding_window: 0: full causal
        returns out: like:query [T, Hq, D]
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def mla_attention(
        self,
        q_latent: torch.Tensor,
        q_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        scale: float,
        kv_scale: float = 1.0,
    ) -> torch.Tensor:
        """Multi-head latent attention over the latent cache with absorbed weights: score(t, h, p) =
        scale * (q_latent[t, h] . c[p, :L] + q_pe[t, h] . c[p, L:]) where c is the cached
        concat(kv_c, k_pe) (times kv_scale when fp8); out[t, h] = softmax_p(score) . c[p, :L].
        Causality and metadata as paged_attention. The caller absorbs W_UK into q_latent and applies
        W_UV to the output.

        q_latent: fp32/fp16/bf16 [T, H, L]: q_nope @ W_UK per head
        q_pe: fp32/fp16/bf16 [T, H, R]: rotated rope part of q
        kv_cache: fp32/fp16/bf16/fp8e4m3fn/fp8e4m3fnuz [NB, BS, L+R]
        block_tables: int32/int64 [B, MB]: physical block of each logical block
        seq_lens: int32/int64 [B]: cached tokens per sequence, new ones included
        query_start_loc: int32/int64 [B+1]: prefix sum of query lengths
        returns out: like:q_latent [T, H, L]
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def kv_compress(
        self,
        state_cache: torch.Tensor,
        position_bias: torch.Tensor,
        block_tables: torch.Tensor,
        window_seq: torch.Tensor,
        window_index: torch.Tensor,
        overlap: bool = False,
    ) -> torch.Tensor:
        """The KV compressor's state update. state_cache holds each token's projected [kv | gate] at
        its paged slot (CD = C*D features each; C = 2 with overlap, else 1). Row n compresses window
        w = window_index[n] of sequence window_seq[n] (positions w*R .. w*R+R-1, all already
        written): slot j of the window contributes kv_j and logit gate_j + position_bias[j]; with
        overlap (CSA) window w contributes its second half (features D..2D) and, when w > 0, window
        w-1 contributes its first half (features 0..D) as R more slots. out[n, d] = sum_j
        softmax_j(logit[j, d]) * kv[j, d], in fp32, rounded once to the cache's dtype. Norm and
        rotary of the entry are the caller's (rms_norm, rotary_embedding).

        state_cache: fp32/fp16/bf16 [NB, BS, 2*CD]: per-token [kv | gate] projections
        position_bias: fp32 [R, CD]: learned bias per slot of a window (DeepSeek's ape)
        block_tables: int32/int64 [B, MB]: physical block of each logical block
        window_seq: int32/int64 [N]: sequence (block_tables row) of each window
        window_index: int32/int64 [N]: window number w within its sequence
        overlap: CSA's two-series overlapping windows
        returns out: like:state_cache overlap=True: [N, cdiv(CD,2)]; overlap=False: [N, CD]
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def indexer_topk(
        self,
        q: torch.Tensor,
        weights: torch.Tensor,
        key_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        top_k: int,
        compress_rate: int,
        scale: float = 1.0,
        ids_dtype: torch.dtype = torch.int32,
    ) -> torch.Tensor:
        """The Lightning Indexer's selection. For query row t at position p of sequence b, score(t, w)
        = scale * sum_h weights[t, h] * relu(q[t, h] . K[w]) over the compressed indexer keys K
        (entry w at the slot of position (w+1)*R-1) with w < (p+1) // R, in fp32. ids[t] = the top_k
        entries by score, equal scores to the lower entry, padded with -1 when fewer entries are
        visible; id order within a row is not part of the contract (compared as sets).

        q: fp32/fp16/bf16 [T, HI, DI]: rotated indexer queries
        weights: fp32 [T, HI]: per-head query weights
        key_cache: fp32/fp16/bf16 [NB, BS, DI]: compressed indexer keys
        block_tables: int32/int64 [B, MB]: physical block of each logical block
        seq_lens: int32/int64 [B]: cached tokens per sequence, new ones included
        query_start_loc: int32/int64 [B+1]: prefix sum of query lengths
        ids_dtype: width of ids
        returns ids: param:ids_dtype [T, top_k]
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def compressed_attention(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        compressed_cache: torch.Tensor | None,
        sinks: torch.Tensor | None,
        topk_ids: torch.Tensor | None,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        scale: float,
        sliding_window: int,
        compress_rate: int = 0,
    ) -> torch.Tensor:
        """DeepSeek-V4 attention, shared-KV MQA (one head of keys that are also the values). Query row
        t at position p of sequence b sees the cached positions p - W < s <= p of kv_cache and, when
        compress_rate R > 0, the compressed entries of compressed_cache: those in topk_ids[t] that
        are >= 0 (CSA), or every w < (p+1)//R (HCA, topk_ids absent). logits = scale * q[t, h] . k;
        a per-head sink logit sinks[h] joins the softmax and contributes no value; out[t, h] = sum
        probs * k. Softmax and sums in fp32, rounded once to q's dtype.

        q: fp32/fp16/bf16 [T, H, D]
        kv_cache: fp32/fp16/bf16 [NB, BS, D]: the sliding branch's K=V
        compressed_cache: fp32/fp16/bf16 [NB, BS, D]: compressed entries
        sinks: fp32 [H]: attention sink logit per head
        topk_ids: int32/int64 [T, K]: indexer's entries per row, -1 none
        block_tables: int32/int64 [B, MB]: physical block of each logical block
        seq_lens: int32/int64 [B]: cached tokens per sequence, new ones included
        query_start_loc: int32/int64 [B+1]: prefix sum of query lengths
        compress_rate: 0: sliding branch only
        returns out: like:q [T, H, D]
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def moe_route(
        self,
        router_logits: torch.Tensor,
        correction_bias: torch.Tensor | None = None,
        token_ids: torch.Tensor | None = None,
        hash_table: torch.Tensor | None = None,
        *,
        top_k: int,
        scoring: Literal['softmax', 'sigmoid', 'sqrt_softplus'] = 'softmax',
        selection: Literal['topk', 'hash'] = 'topk',
        renormalize: bool = False,
        n_group: int = 1,
        topk_group: int = 1,
        routed_scaling_factor: float = 1.0,
        ids_dtype: torch.dtype = torch.int32,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """scores = softmax | sigmoid | sqrt(softplus) of router_logits in fp32. Selection 'topk':
        choice = scores + correction_bias (when given); with n_group > 1 the experts split into
        n_group equal groups, a group's score is the sum of its two best choices, all but the best
        topk_group groups are masked to -inf; topk_ids = top_k of choice. Selection 'hash': topk_ids
        = hash_table[token_ids]. Then topk_weights = scores at topk_ids (bias never enters a
        weight), divided by their sum when renormalize, times routed_scaling_factor. Id order within
        a row is not part of the contract (compared as sets).

        router_logits: fp32/fp16/bf16 [T, E]
        correction_bias: fp32 [E]: e_score_correction_bias
        token_ids: int32/int64 [T]: token id of each row (hash routing)
        hash_table: int32/int64 [V, K]: token id -> its experts (tid2eid)
        ids_dtype: width of topk_ids
        returns topk_weights: fp32 [T, top_k]
        returns topk_ids: param:ids_dtype [T, top_k]
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def fused_moe(
        self,
        hidden: torch.Tensor,
        w13: torch.Tensor,
        w2: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        expert_map: torch.Tensor | None = None,
        w13_scale: torch.Tensor | None = None,
        w2_scale: torch.Tensor | None = None,
        activation: Literal['silu'] = 'silu',
        swiglu_limit: float = 0.0,
    ) -> torch.Tensor:
        """out[t] = sum_k topk_weights[t, k] * w2[e] @ (silu(g) * u) with g = w13[e, :I] @ x and u =
        w13[e, I:] @ x (with swiglu_limit L > 0, DeepSeek-V4's clipping: g = min(g, L), u = clamp(u,
        -L, L)) and e = topk_ids[t, k], mapped through expert_map (global -> local id, -1: not on
        this rank, contributes nothing) when one is given. fp8 weights are dequantised as w *
        scale[i // 128, j // 128] (DeepSeek's weight_scale_inv). Accumulation in fp32, rounded once
        to hidden's dtype. With fp8 weights every step is fp32 (the dequantised weights are not half
        values), so the result is within fp32 accuracy before that one rounding. With fp16/bf16
        weights the expert GEMMs may run in that dtype, rounding the intermediates (w13 @ x and the
        activation) to it, as vLLM's fused_moe does; the sum over experts stays fp32.

        hidden: fp32/fp16/bf16 [T, H]
        w13: fp32/fp16/bf16/fp8e4m3fn/fp8e4m3fnuz [E, 2*I, H]: gate and up projections stacked
        w2: fp32/fp16/bf16/fp8e4m3fn/fp8e4m3fnuz [E, H, I]: down projections stacked
        topk_weights: fp32 [T, K]
        topk_ids: int32/int64 [T, K]
        expert_map: int32/int64 [EG]: global expert -> local id or -1
        w13_scale: fp32 [E, cdiv(2*I,128), cdiv(H,128)]
        w2_scale: fp32 [E, cdiv(H,128), cdiv(I,128)]
        swiglu_limit: clip of the pre-activations; 0: none
        returns out: like:hidden [T, H]
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def quantize_fp8(
        self,
        x: torch.Tensor,
        scale: torch.Tensor | None = None,
        mode: Literal['per_tensor', 'per_token', 'per_group'] = 'per_token',
        group_size: int = 128,
        fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """scales = max(amax(|x|) over the granule, 1e-10) / FP8_MAX[fp8_dtype] in fp32 (granule: the
        whole tensor, each row, or each 128-wide group of a row), or the given static per-tensor
        scale; q = clamp(x / scale, -FP8_MAX, FP8_MAX) rounded to nearest fp8 (computed in fp32,
        rounded once).

        x: fp32/fp16/bf16 [T, H]
        scale: fp32 [1, 1]: static per-tensor scale
        returns q: param:fp8_dtype [T, H]
        returns scales: fp32 mode=per_tensor: [1, 1]; mode=per_token: [T, 1]; mode=per_group: [T,
        cdiv(H,group_size)]
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def scaled_mm(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        a_scale: torch.Tensor,
        b_scale: torch.Tensor,
        bias: torch.Tensor | None = None,
        scale_mode: Literal['tensor', 'row', 'block'] = 'tensor',
        out_dtype: torch.dtype = torch.bfloat16,
    ) -> torch.Tensor:
        """out = (a * a_scale) @ (b * b_scale)^T (+ bias), a as activations [M, K] and b as a weight
        [N, K] like F.linear, accumulated in fp32 and rounded once to out_dtype. scale_mode
        'tensor': both scales (1, 1); 'row': a_scale (M, 1) per token and b_scale (N, 1) per output
        channel; 'block': a_scale (M, K/128) per 1x128 group and b_scale (N/128, K/128) per 128x128
        tile.

        a: fp8e4m3fn/fp8e4m3fnuz [M, K]
        b: fp8e4m3fn/fp8e4m3fnuz [N, K]
        a_scale: fp32 scale_mode=tensor: [1, 1]; scale_mode=row: [M, 1]; scale_mode=block: [M,
        cdiv(K,128)]
        b_scale: fp32 scale_mode=tensor: [1, 1]; scale_mode=row: [N, 1]; scale_mode=block:
        [cdiv(N,128), cdiv(K,128)]
        bias: fp32/fp16/bf16 [N]
        returns out: param:out_dtype [M, N]
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def sample(
        self,
        logits: torch.Tensor,
        temperature: torch.Tensor,
        top_k: torch.Tensor,
        top_p: torch.Tensor,
        min_p: torch.Tensor,
        seeds: torch.Tensor,
        num_logprobs: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per row b: a row with temperature < 1e-5 is greedy, token = argmax(logits) (first index on
        ties). Otherwise l = logits / temperature in fp32, p = softmax(l), then filters, each
        leaving p renormalised: top_k > 0 keeps tokens whose p is at least the k-th largest; top_p <
        1 keeps, in descending p order, each token whose preceding cumulative p is below top_p;
        min_p > 0 keeps tokens with p >= min_p * max(p). The draw is defined exactly so every
        backend agrees: u = torch.rand(V, generator=torch.Generator('cpu').manual_seed(seeds[b])),
        token = argmax(p / -log(u)) (an exponential race, which samples from p). logprobs are those
        of the raw logits (log_softmax before any filter): the chosen token's, and the top
        num_logprobs of the row. top_p must be in (0, 1] and min_p in [0, 1] (the engine's
        SamplingParams enforce it; kernels need not check values).

        logits: fp32/fp16/bf16 [B, V]
        temperature: fp32 [B]
        top_k: int32 [B]: <= 0: off
        top_p: fp32 [B]: 1.0: off
        min_p: fp32 [B]: 0.0: off
        seeds: int64 [B]: the draw's seed per row
        num_logprobs: N top logprobs to return per row
        returns token_ids: int64 [B]
        returns logprobs: fp32 [B]
        returns top_logprobs: fp32 [B, num_logprobs]
        returns top_token_ids: int64 [B, num_logprobs]
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def rejection_sample(
        self,
        target_logits: torch.Tensor,
        draft_token_ids: torch.Tensor,
        num_draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None,
        temperature: torch.Tensor,
        top_k: torch.Tensor,
        top_p: torch.Tensor,
        min_p: torch.Tensor,
        uniforms: torch.Tensor,
        race_uniforms: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Speculative decoding's check of K drafted tokens per row against the target model (Leviathan
        et al. 2023; Chen et al. 2023), lossless: each emitted token is distributed as the target's.
        Row b has num_draft_tokens[b] <= K drafts d_j; target_logits[b, j] are the target's logits
        after the first j of them (j = 0..K). p_j is the target's sampling distribution at j exactly
        as the sample contract defines it (temperature, then top-k, top-p, min-p, renormalised); q_j
        is draft_probs[b, j] (the draft's filtered distribution), or a point mass on d_j when
        draft_probs is absent (n-gram and other deterministic proposers). A greedy row (temperature
        < 1e-5) accepts d_j while d_j == argmax(target_logits[b, j]) (first maximum) and emits that
        argmax after the last accepted draft. A sampled row accepts d_j while uniforms[b, j] *
        q_j(d_j) < p_j(d_j) (a draft with q_j(d_j) = 0 is accepted iff p_j(d_j) > 0); at the first
        rejected j it emits a draw from max(0, p_j - q_j) renormalised (the recovered token; p_j
        where that is all zero), and with every draft accepted a draw from p_K at the row's last
        draft position n = num_draft_tokens[b] (the bonus token). The draw is the sample contract's
        exponential race over the row's race_uniforms: argmax over tokens r > 0 of r /
        -log(race_uniforms[b]). output_token_ids[b] holds the accepted drafts then the emitted
        token, -1 after it; num_accepted[b] counts the accepted drafts.

        target_logits: fp32/fp16/bf16 [B, K + 1, V]
        draft_token_ids: int64 [B, K]
        num_draft_tokens: int32 [B]: drafts per row, at most K
        draft_probs: fp32 [B, K, V]: absent: each draft is a point mass
        temperature: fp32 [B]
        top_k: int32 [B]: <= 0: off
        top_p: fp32 [B]: 1.0: off
        min_p: fp32 [B]: 0.0: off
        uniforms: fp32 [B, K]: acceptance draws in [0, 1)
        race_uniforms: fp32 [B, V]: the emitted token's race, in [0, 1)
        returns output_token_ids: int64 [B, K + 1]
        returns num_accepted: int32 [B]
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__

    def kv_convert(
        self,
        src_cache: torch.Tensor,
        dst_cache: torch.Tensor,
        src_slots: torch.Tensor,
        dst_slots: torch.Tensor,
        src_scale: float = 1.0,
        dst_scale: float = 1.0,
    ) -> None:
        """For each token t with d = dst_slots[t] >= 0 and s = src_slots[t]: v = src_cache[s // BSs, s
        % BSs] in fp32, times src_scale (fp32) when src_cache is fp8; dst_cache[d // BSd, d % BSd] =
        v / dst_scale (fp32 IEEE division) saturated to the fp8 range when dst_cache is fp8, else v;
        rounded to nearest even in dst_cache's dtype. A negative destination slot is skipped.

        src_cache: fp32/fp16/bf16/fp8e4m3fn/fp8e4m3fnuz [NBs, BSs, W]: the KV as the producer's spec
        holds it
        dst_cache: fp32/fp16/bf16/fp8e4m3fn/fp8e4m3fnuz [NBd, BSd, W] (written in place): the
        consumer's cache
        src_slots: int32/int64 [T]: flat source slot per token
        dst_slots: int32/int64 [T]: flat destination slot per token, -1 skips
        src_scale: the source's fp8 scale (ignored for a float source)
        dst_scale: the destination's fp8 scale (ignored for a float destination)
        returns None: writes its in-place arguments
        """
        raise NotImplementedError  # served by OpDispatcher.__getattr__
