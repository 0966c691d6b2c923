"""Deliberately broken backends for conformance's own tests: each is the reference
backend with one kernel swapped for a plausible bug, so a test can show the bug is
caught and everything else still passes."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch

from accord.backends import Backend, ToleranceOverride, get_backend
from accord.op_contracts import Kernel, KernelSet


class PatchedReference(Backend):
    """The reference kernels, except the ones given (keyed by op), under a new name."""

    device_type = "cpu"

    def __init__(
        self,
        name: str,
        *replacements: Kernel,
        missing: tuple[str, ...] = (),
        nondeterministic: tuple[str, ...] = (),
        batch_variant: tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        self.name = name
        self._replacements = replacements
        self._missing = missing
        self._nondeterministic = frozenset(nondeterministic)
        self._batch_variant = frozenset(batch_variant)

    def load_kernels(self) -> KernelSet:
        # Each kernel runs through its own function, so conformance judges the double
        # as a backend of its own rather than reporting the reference's kernels shared.
        kernels = KernelSet()
        for op, kernel in get_backend("reference").kernels().as_dict().items():
            if op not in self._missing:
                kernels.add(dataclasses.replace(kernel, fn=own_function(kernel.fn)))
        for kernel in self._replacements:
            kernels.add(dataclasses.replace(kernel, fn=own_function(kernel.fn)))
        return kernels

    def nondeterministic_ops(self) -> frozenset[str]:
        return self._nondeterministic

    def batch_variant_ops(self) -> frozenset[str]:
        return get_backend("reference").batch_variant_ops() | self._batch_variant


def own_function(fn: Any) -> Any:
    """`fn` behind a function object of its own (same behaviour, another identity)."""
    return lambda **call: fn(**call)


def reference_fn(op: str) -> Any:
    """The reference backend's kernel function for `op`."""
    return get_backend("reference").kernel_for(op).fn


def route_reading_companions_at_token_id_width(**call: Any) -> None:
    """The motivating crash: the kernel takes its index width from token_ids and reads
    the hash table at that width, whatever the table's own dtype."""
    if call["hash_table"] is not None:
        call["hash_table"] = call["hash_table"].view(call["token_ids"].dtype)
    reference_fn("moe_route")(**call)


def route_without_renormalisation(**call: Any) -> None:
    """Forgets to divide the top-k weights by their sum."""
    reference_fn("moe_route")(**{**call, "renormalize": False})


def rms_norm_writing_half_the_columns(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """Writes only the first half of each output row (a wrong loop bound)."""
    full = torch.empty_like(out)
    reference_fn("rms_norm")(x=x, weight=weight, eps=eps, out=full)
    half = out.shape[1] // 2
    out[:, :half] = full[:, :half]


def rms_norm_writing_past_its_output(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """Correct values, plus one element stored just past the end of the buffer."""
    reference_fn("rms_norm")(x=x, weight=weight, eps=eps, out=out)
    torch.as_strided(out, (out.numel() + 1,), (1,))[-1] = 0


def rms_norm_off_by_a_thousandth(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """Every value 0.1% high: far outside the fp32 bound, inside a declared 1e-4."""
    reference_fn("rms_norm")(x=x, weight=weight, eps=eps, out=out)
    out.mul_(1.001)


def rms_norm_with_noise(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """Correct within tolerance (an fp32 ulp at most), but fresh noise every call (a
    racy reduction)."""
    reference_fn("rms_norm")(x=x, weight=weight, eps=eps, out=out)
    out.mul_(1 + 2**-23 * torch.randint(0, 2, out.shape))


def rms_norm_depending_on_batch_size(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """Correct within tolerance (an fp32 ulp or two), but each row's rounding depends
    on the batch size (a kernel that picks its reduction split by the number of rows)."""
    reference_fn("rms_norm")(x=x, weight=weight, eps=eps, out=out)
    out.mul_(1 + 2**-23 * min(x.shape[0], 2))


class WideToleranceBackend(PatchedReference):
    """Declares a wider rms_norm tolerance, as a backend with a known rounding mode would."""

    def tolerance_override(self, op: str, dtypes: Mapping[str, torch.dtype]) -> ToleranceOverride | None:
        if op == "rms_norm":
            return ToleranceOverride(1e-4, "test double: values rounded 0.1% high")
        return None


def broken(name: str, op: str, fn: Any, declares: str = "", **claims: tuple[torch.dtype, ...]) -> PatchedReference:
    """The reference backend with `op`'s kernel replaced by `fn` (claiming `claims`);
    `declares` may name `nondeterministic` or `batch_variant` for the op."""
    return PatchedReference(name, Kernel(op, fn, claims), **({declares: (op,)} if declares else {}))


def attention_with_default_scale(**call: Any) -> None:
    """Derives the softmax scale from the head size, ignoring the `scale` argument."""
    reference_fn("paged_attention")(**{**call, "scale": call["query"].shape[-1] ** -0.5})


def attention_with_k_scale_for_values(**call: Any) -> None:
    """Dequantises the value cache with k_scale (one scale for both)."""
    reference_fn("paged_attention")(**{**call, "v_scale": call["k_scale"]})


def attention_dropping_the_block_edge_key(**call: Any) -> None:
    """A prefill whose cached length ends on a block edge loses its last key (a block
    count of seq_len // block_size on the prefill path; decodes are right)."""
    block_size = call["key_cache"].shape[1]
    query_lens = call["query_start_loc"].diff()
    on_edge = (query_lens > 1) & (call["seq_lens"] % block_size == 0)
    reference_fn("paged_attention")(**{**call, "seq_lens": call["seq_lens"] - on_edge.to(call["seq_lens"].dtype)})


def cache_store_without_saturation(**call: Any) -> None:
    """Stores value / scale into an fp8 cache by a plain cast: out-of-range values
    become NaN instead of the largest finite value."""
    slots = call["slot_mapping"].long()
    written = slots >= 0
    for name, source, scale in (("key_cache", "key", "k_scale"), ("value_cache", "value", "v_scale")):
        cache = call[name]
        flat = cache.view(-1, *cache.shape[2:])
        flat[slots[written]] = (call[source][written].float() / call[scale]).to(cache.dtype)


def rms_norm_with_fixed_eps(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """Ignores the eps argument (1e-6 hard-coded)."""
    reference_fn("rms_norm")(x=x, weight=weight, eps=1e-6, out=out)


def quantize_without_amax_floor(**call: Any) -> None:
    """Scales by amax / FP8_MAX without the floor: an all-zero granule gets scale 0
    and 0 / 0 = NaN values."""
    reference_fn("quantize_fp8")(**call)
    x, scales, q = call["x"], call["scales"], call["q"]
    if call["scale"] is None:
        group = x.shape[1] if scales.shape[1] == 1 else call["group_size"]
        padded = torch.nn.functional.pad(x.float().abs(), (0, -x.shape[1] % group))
        amax = padded.view(x.shape[0], -1, group).amax(-1)
        zero = (amax.max() == 0).view(1, 1) if call["mode"] == "per_tensor" else amax == 0
        scales[zero] = 0
        per_element = zero.repeat_interleave(group, 1)[:, : x.shape[1]].expand_as(q)
        nan = torch.tensor([float("nan")]).to(q.dtype).view(torch.uint8)
        q.view(torch.uint8)[per_element] = nan


def scaled_mm_reusing_the_last_full_k_scale(**call: Any) -> None:
    """Block mode with a partial last K group: that group is scaled by the previous
    group's scales (a K-group count of K // 128)."""
    if call["scale_mode"] == "block" and call["a"].shape[1] % 128:
        a_scale, b_scale = call["a_scale"].clone(), call["b_scale"].clone()
        a_scale[:, -1], b_scale[:, -1] = a_scale[:, -2], b_scale[:, -2]
        call = {**call, "a_scale": a_scale, "b_scale": b_scale}
    reference_fn("scaled_mm")(**call)


def route_scaling_only_when_renormalising(**call: Any) -> None:
    """Applies routed_scaling_factor only on the renormalising path."""
    factor = call["routed_scaling_factor"] if call["renormalize"] else 1.0
    reference_fn("moe_route")(**{**call, "routed_scaling_factor": factor})


def sampler(
    *,
    greedy_last: bool = False,
    temperature_last: bool = False,
    top_p_drops_boundary: bool = False,
    top_p_keeps_one_more: bool = False,
    top_k_shift: int = 0,
    top_k_drops_ties: bool = False,
    top_p_before_top_k: bool = False,
) -> Any:
    """A sampler with one boundary bug: greedy ties to the last index, temperature
    applied after the filters, top-p dropping the token that crosses top_p or keeping
    one token past it, top-k keeping `top_k + top_k_shift` tokens or exactly top_k
    (a tie at the k-th token cut by index), or top-p judged on the distribution before
    top-k's renormalisation."""
    from accord.backends.reference.kernels.sampling import _draw, _filtered, _renormalised

    def fn(**call: Any) -> None:
        reference_fn("sample")(**call)
        for b, row in enumerate(call["logits"].float()):
            temperature = float(call["temperature"][b])
            top_k, top_p, min_p = int(call["top_k"][b]), float(call["top_p"][b]), float(call["min_p"][b])
            if temperature < 1e-5:
                token = row.numel() - 1 - int(torch.argmax(row.flip(0))) if greedy_last else int(torch.argmax(row))
            else:
                probs = torch.softmax(row if temperature_last else row / temperature, dim=0)
                top_k = top_k + top_k_shift if top_k > 0 else top_k
                if (top_p_drops_boundary or top_p_keeps_one_more) and top_p < 1.0:
                    probs = _filtered(probs, top_k, 1.0, 0.0)
                    ordered, order = probs.sort(descending=True, stable=True)
                    keep = torch.zeros_like(probs, dtype=torch.bool)
                    preceding = ordered.cumsum(0) - ordered
                    if top_p_drops_boundary:  # the token crossing top_p goes too
                        keep[order] = preceding + ordered < top_p
                    else:  # judged by its predecessor's preceding mass: one more stays
                        keep[order] = torch.cat([preceding.new_zeros(1), preceding[:-1]]) < top_p
                    keep[order[0]] = True
                    probs = _filtered(_renormalised(probs, keep), 0, 1.0, min_p)
                elif top_k_drops_ties and top_k > 0:
                    keep = torch.zeros_like(probs, dtype=torch.bool)
                    keep[probs.sort(descending=True, stable=True).indices[:top_k]] = True
                    probs = _filtered(_renormalised(probs, keep), 0, top_p, min_p)
                elif top_p_before_top_k and top_k > 0 and top_p < 1.0:
                    nucleus, best = _filtered(probs, 0, top_p, 0.0) > 0, _filtered(probs, top_k, 1.0, 0.0) > 0
                    probs = _filtered(_renormalised(probs, nucleus & best), 0, 1.0, min_p)
                else:
                    probs = _filtered(probs, top_k, top_p, min_p)
                if temperature_last:
                    probs = _renormalised(probs ** (1 / temperature), probs > 0)
                token = _draw(probs, int(call["seeds"][b]))
            call["token_ids"][b] = token
            call["logprobs"][b] = torch.log_softmax(row.double(), dim=0)[token]

    return fn


def quantize_with_half_precision_scales(**call: Any) -> None:
    """Rounds dynamic scales to x's precision (amax / FP8_MAX in bf16 for bf16 x) and
    quantises by them: the dequantised values barely move, the scales do."""
    x = call["x"]
    if call["scale"] is not None or x.dtype == torch.float32:
        return reference_fn("quantize_fp8")(**call)
    reference_fn("quantize_fp8")(**call)
    reference_fn("quantize_fp8")(**{**call, "scale": call["scales"].to(x.dtype).float()})


def scaled_mm_with_a_bf16_accumulator(**call: Any) -> None:
    """Sums each 128-wide K group in fp32 but carries the running sum across groups
    in bf16 (a split-K reduction with bf16 partials)."""
    a, b = call["a"].float(), call["b"].float()
    total = None
    for start in range(0, a.shape[1], 128):
        keep = torch.zeros(a.shape[1], dtype=torch.bool)
        keep[start : start + 128] = True
        part = torch.empty(call["out"].shape, dtype=torch.float32)
        reference_fn("scaled_mm")(**{
            **call, "a": (a * keep).to(call["a"].dtype), "b": (b * keep).to(call["b"].dtype), "bias": None, "out": part,
        })
        total = part.bfloat16() if total is None else total + part.bfloat16()
    if call["bias"] is not None:
        total = total + call["bias"].bfloat16()
    call["out"].copy_(total)


def fused_moe_with_bf16_dequantised_weights(**call: Any) -> None:
    """Dequantises fp8 expert weights to bf16 and runs the expert GEMMs in bf16
    (rounding the dequantised weights and every intermediate), summing in fp32."""
    if call["w13_scale"] is None:
        return reference_fn("fused_moe")(**call)
    weights = {}
    for name in ("w13", "w2"):
        stored, scale = call[name].float(), call[f"{name}_scale"]
        per_element = scale.repeat_interleave(128, 1)[:, : stored.shape[1]]
        weights[name] = (stored * per_element.repeat_interleave(128, 2)[:, :, : stored.shape[2]]).bfloat16()
    ids = call["topk_ids"].long()
    if call["expert_map"] is not None:
        ids = call["expert_map"].long()[ids]
    x, limit, half = call["hidden"].bfloat16(), call["swiglu_limit"], weights["w13"].shape[1] // 2
    total = torch.zeros(call["out"].shape, dtype=torch.float32)
    for expert in ids.unique().tolist():
        if expert < 0:
            continue
        tokens, slots = (ids == expert).nonzero(as_tuple=True)
        gate_up = x[tokens] @ weights["w13"][expert].T
        gate, up = gate_up[:, :half], gate_up[:, half:]
        if limit > 0:
            gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        expert_out = (torch.nn.functional.silu(gate) * up) @ weights["w2"][expert].T
        total.index_add_(0, tokens, expert_out.float() * call["topk_weights"][tokens, slots, None])
    call["out"].copy_(total)


def rotary_with_the_table_in_the_query_dtype(**call: Any) -> None:
    """Reads the cos/sin table rounded to the query's dtype (a cast to the activation
    dtype before the kernel): rotations of nearly cancelling pairs lose many ulps."""
    table = call["cos_sin_cache"].to(call["query"].dtype).float()
    reference_fn("rotary_embedding")(**{**call, "cos_sin_cache": table})


def rms_norm_in_the_input_dtype(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """Computes the whole norm in x's dtype (each step rounded), not in fp32."""
    out.copy_(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight)


class Bf16CopyReference(PatchedReference):
    """The reference backend with a bf16 weight-streaming shortcut for few rows, as the
    cpu backend has: `prepare_linear_weight` keeps a bf16 copy of an fp32 weight (only
    of weights whose values are exactly bf16 when `check_exact`), and `linear` at up to
    4 rows computes on that copy with `x` rounded to bf16 when `round_x`."""

    def __init__(self, name: str, check_exact: bool, round_x: bool) -> None:
        super().__init__(name, Kernel("linear", self._linear, {}), batch_variant=("linear",))
        self.check_exact, self.round_x = check_exact, round_x

    def prepare_linear_weight(self, weight: torch.Tensor) -> torch.Tensor:
        copy = weight.to(torch.bfloat16)
        if weight.dtype != torch.float32 or (self.check_exact and not torch.equal(copy.float(), weight)):
            return weight
        prepared = weight.clone()
        prepared.bf16_copy = copy
        return prepared

    def _linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype | None,
        out: torch.Tensor,
    ) -> None:
        copy = getattr(weight, "bf16_copy", None)
        if copy is None or x.shape[0] > 4:
            reference_fn("linear")(x=x, weight=weight, bias=bias, out_dtype=out_dtype, out=out)
            return
        activations = x.to(torch.bfloat16).float() if self.round_x else x
        reference_fn("linear")(x=activations, weight=copy.float(), bias=bias, out_dtype=out_dtype, out=out)


def linear_guessing_the_weight_orientation(**call: Any) -> None:
    """Takes a weight whose first dimension matches x's features for [K, N] and
    multiplies without transposing it: right for every N != K, wrong when square."""
    weight = call["weight"]
    if weight.shape[0] == call["x"].shape[1]:
        weight = weight.T.contiguous()
    reference_fn("linear")(**{**call, "weight": weight})


def linear_dropping_the_k_remainder(**call: Any) -> None:
    """Past one full 128-wide K block, sums only whole blocks (a remainder loop that
    never runs): right for K < 128 and for multiples of 128."""
    x, depth = call["x"], call["x"].shape[1]
    if depth > 128 and depth % 128:
        keep = torch.arange(depth) < depth // 128 * 128
        x = x * keep.to(x.dtype)
    reference_fn("linear")(**{**call, "x": x})


def linear_with_a_half_running_sum(**call: Any) -> None:
    """For a half-precision output, carries the running sum over K in that dtype: each
    16-wide K chunk is summed in fp32 and added to the half running sum (a K-split
    whose partials are kept in the output dtype)."""
    x, weight, out = call["x"], call["weight"], call["out"]
    if out.dtype == torch.float32:
        return reference_fn("linear")(**call)
    total = torch.zeros(out.shape, dtype=out.dtype)
    for k in range(0, x.shape[1], 16):
        total = (total.float() + x[:, k : k + 16].float() @ weight[:, k : k + 16].float().T).to(out.dtype)
    if call["bias"] is not None:
        total = (total.float() + call["bias"].float()).to(out.dtype)
    out.copy_(total)


def kv_compress_reading_a_window_from_one_block(**call: Any) -> None:
    """Reads each window contiguously from its first slot's block (right whenever the
    rate divides the block size, so no window crosses a block edge)."""
    from unittest import mock

    from accord.backends.reference.kernels import compressed

    def first_block_slots(table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
        first = positions[:1]
        return table.long()[first // block_size] * block_size + first % block_size + (positions - first)

    with mock.patch.object(compressed, "_slots", first_block_slots):
        reference_fn("kv_compress")(**call)


def kv_compress_taking_the_previous_rows_window(**call: Any) -> None:
    """With overlap, pools a window with the previous output row's window as its
    predecessor (right when a sequence's windows are listed in order, as a prefill's
    are; wrong for a decode step's one newly closed window per sequence)."""
    from accord.backends.reference.kernels.compressed import _slots

    reference_fn("kv_compress")(**call)
    if not call["overlap"]:
        return
    state, out, bias = call["state_cache"], call["out"], call["position_bias"].double()
    block_size, width = state.shape[1], state.shape[2]
    flat, rate, dim, features = state.reshape(-1, width).double(), bias.shape[0], out.shape[1], width // 2
    seqs, windows = call["window_seq"].tolist(), call["window_index"].tolist()

    def window_rows(seq: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = flat[_slots(call["block_tables"][seq], torch.arange(w * rate, (w + 1) * rate), block_size)]
        return rows[:, :features], rows[:, features:] + bias

    for n in range(1, len(seqs)):
        if windows[n] == 0 or (seqs[n - 1], windows[n - 1]) == (seqs[n], windows[n] - 1):
            continue
        (kv, gate), (prev_kv, prev_gate) = window_rows(seqs[n], windows[n]), window_rows(seqs[n - 1], windows[n - 1])
        kv, gate = torch.cat([prev_kv[:, :dim], kv[:, dim:]]), torch.cat([prev_gate[:, :dim], gate[:, dim:]])
        out[n] = (torch.softmax(gate, dim=0) * kv).sum(dim=0)


def indexer_ties_to_the_higher_entry(**call: Any) -> None:
    """Breaks equal scores toward the higher entry (an unstable or reversed sort):
    scoring the entries in reverse order and mapping the picks back."""
    from unittest import mock

    from accord.backends.reference.kernels import compressed

    def reversed_entries(table: torch.Tensor, entries: torch.Tensor, rate: int, block_size: int) -> torch.Tensor:
        return compressed._slots(table, (entries.flip(0) + 1) * rate - 1, block_size)

    with mock.patch.object(compressed, "_entry_slots", reversed_entries):
        reference_fn("indexer_topk")(**call)
    ids = call["ids"]
    # Pick j of the reversed scoring is entry visible - 1 - j of the row.
    _, visible = _visible_entries(call)
    picked = ids >= 0
    ids[picked] = (visible[:, None].expand_as(ids)[picked] - 1 - ids[picked].long()).to(ids.dtype)


def _visible_entries(call: Any) -> tuple[list[tuple[int, int, int]], torch.Tensor]:
    """Each query row's (sequence, row, position) and how many entries it sees."""
    from accord.backends.reference.kernels.compressed import _query_positions

    rows = _query_positions(call["seq_lens"], call["query_start_loc"])
    visible = torch.zeros(call["q"].shape[0], dtype=torch.int64)
    for _, row, position in rows:
        visible[row] = (position + 1) // call["compress_rate"]
    return rows, visible


def compressed_attention_reading_minus_one_as_entry_0(**call: Any) -> None:
    """Marks picked entries in a visibility mask at clamp(id, 0): a -1 pad marks entry
    0 (harmless in a row that picked entry 0 anyway, as every full row does)."""
    ids = call["topk_ids"]
    if ids is not None:
        marked = torch.full_like(ids, -1)
        for row in range(ids.shape[0]):
            unique = ids[row].clamp(min=0).unique()
            marked[row, : unique.numel()] = unique
        call = {**call, "topk_ids": marked}
    reference_fn("compressed_attention")(**call)


def fused_moe_clipping_only_float_weights_under_a_map(**call: Any) -> None:
    """Applies swiglu_limit only on the float-weight, expert-map path (the one V4's
    cases exercised); fp8 weights and local ids run unclipped."""
    if call["w13_scale"] is not None or call["expert_map"] is None:
        call = {**call, "swiglu_limit": 0.0}
    reference_fn("fused_moe")(**call)


def route_biasing_only_sigmoid(**call: Any) -> None:
    """Adds the correction bias to the choice only under sigmoid scoring."""
    if call["scoring"] != "sigmoid":
        call = {**call, "correction_bias": None}
    reference_fn("moe_route")(**call)


def route_exponentiating_without_the_max(**call: Any) -> None:
    """Exponentiates raw logits in their own dtype (softmax without subtracting the
    row's max; softplus as log1p(exp(x))): a row where exp overflows gets NaN weights."""
    reference_fn("moe_route")(**call)
    logits = call["router_logits"]
    if call["selection"] != "hash" and call["scoring"] in ("softmax", "sqrt_softplus"):
        overflowed = torch.exp(logits).isinf().any(dim=-1)
        call["topk_weights"][overflowed] = float("nan")


def quantize_rounding_toward_zero(**call: Any) -> None:
    """Rounds x / scale toward zero instead of to nearest: each code within one ulp,
    but about half of them one step smaller in magnitude."""
    reference_fn("quantize_fp8")(**call)
    q, scales, x = call["q"], call["scales"], call["x"]
    group = x.shape[1] if scales.shape[1] == 1 else call["group_size"]
    per_element = scales.double().repeat_interleave(group, dim=1)[:, : x.shape[1]].expand(x.shape[0], -1)
    exact = x.double() / per_element
    codes = q.view(torch.uint8)
    away = (q.double().abs() > exact.abs()) & (codes & 0x7F > 0)
    smaller = codes - 1
    smaller[(smaller & 0x7F) == 0] = 0  # the smallest magnitude steps down to +0
    codes[away] = smaller[away]


class Bf16SummingCommunicator:
    """A communicator that carries fp32 reductions as bf16 (a bf16 wire for fp32
    all_reduce and reduce_scatter); everything else is the real one's."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self._inner.all_reduce(x.bfloat16()).float() if x.dtype == torch.float32 else self._inner.all_reduce(x)

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return self._inner.reduce_scatter(x.bfloat16()).float()
        return self._inner.reduce_scatter(x)


def fp32_reductions_real_and_bf16_summing(comm: Any, seed: int) -> dict[str, list[Any]]:
    """On one rank: the fp32 reduction cases on the real communicator and on the
    bf16-summing one (spawn_ranks calls this by name on every rank)."""
    from accord.conformance.collectives import collective_cases, run_case

    cases = [c for c in collective_cases() if c.dtype == torch.float32 and c.collective in ("all_reduce",
                                                                                           "reduce_scatter")]
    return {
        "real": [run_case(comm, case, seed) for case in cases],
        "bf16 sums": [run_case(Bf16SummingCommunicator(comm), case, seed) for case in cases],
    }


def linear_without_an_odd_tail(**call: Any) -> None:
    """Sums input features in pairs and never runs the tail: an odd K loses its last
    feature (every hand-written K is even)."""
    x, depth = call["x"], call["x"].shape[1]
    if depth % 2:
        x = x * (torch.arange(depth) < depth - 1).to(x.dtype)
    reference_fn("linear")(**{**call, "x": x})
