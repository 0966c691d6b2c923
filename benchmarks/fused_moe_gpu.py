"""GPU timings of the Triton fused_moe on a DeepSeek-V2-Lite-like layer (64 experts,
top 6, hidden 2048, intermediate 1408, bf16 activations): fp8 weights on the fp8-dot
path against the same weights dequantised in fp32, and bf16 weights, for a decode- and
a prefill-like token count.

    python benchmarks/fused_moe_gpu.py [--tokens 1,256]

Per case: the median time (triton.testing.do_bench, after autotuning), the weight bytes
of the experts the tokens reach, the bandwidth that makes, and each fp8 path's NMSE
against the exact computation (fp32 activations, dequantised path).
"""

from __future__ import annotations

import argparse
import sys

import torch

EXPERTS, TOP_K, HIDDEN, INTERMEDIATE, BLOCK = 64, 6, 2048, 1408, 128


def block_quantised(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`weight` [E, rows, cols] as e4m3fn with one fp32 scale per 128x128 block."""
    experts, rows, cols = weight.shape
    padded = torch.nn.functional.pad(weight, (0, -cols % BLOCK, 0, -rows % BLOCK))
    blocks = padded.view(experts, padded.shape[1] // BLOCK, BLOCK, padded.shape[2] // BLOCK, BLOCK)
    scales = blocks.abs().amax(dim=(2, 4)).float().clamp_min(1e-10) / torch.finfo(torch.float8_e4m3fn).max
    expanded = scales.repeat_interleave(BLOCK, 1).repeat_interleave(BLOCK, 2)[:, :rows, :cols]
    return (weight.float() / expanded).to(torch.float8_e4m3fn), scales


def nmse(out: torch.Tensor, ref: torch.Tensor) -> float:
    """sum((out - ref)^2) / sum(ref^2), in fp64."""
    out64, ref64 = out.double(), ref.double()
    return ((out64 - ref64).pow(2).sum() / ref64.pow(2).sum()).item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="1,256", help="comma-separated token counts (default: 1,256)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("fused_moe_gpu.py times the kernels on a GPU; torch sees none here", file=sys.stderr)
        return 2
    import triton.testing

    from accord.backends.triton.kernels.fused_moe import Fp8Path, run_fused_moe

    torch.manual_seed(0)
    device = "cuda"
    w13 = torch.randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN, device=device, dtype=torch.bfloat16) * 0.02
    w2 = torch.randn(EXPERTS, HIDDEN, INTERMEDIATE, device=device, dtype=torch.bfloat16) * 0.02
    (w13_q, w13_s), (w2_q, w2_s) = block_quantised(w13), block_quantised(w2)
    print(f"{torch.cuda.get_device_name()}: {EXPERTS} experts, top {TOP_K}, hidden {HIDDEN}, "
          f"intermediate {INTERMEDIATE}")
    print(f"{'tokens':>6} {'case':<22} {'median us':>10} {'weights MB':>10} {'GB/s':>8} {'nmse':>9}")
    for tokens in (int(t) for t in args.tokens.split(",")):
        hidden = torch.randn(tokens, HIDDEN, device=device, dtype=torch.bfloat16)
        logits = torch.randn(tokens, EXPERTS, device=device)
        topk_weights, topk_ids = logits.softmax(-1).topk(TOP_K, dim=-1)
        touched = topk_ids.unique().numel()
        exact = torch.empty(tokens, HIDDEN, device=device, dtype=torch.float32)
        run_fused_moe(hidden.float(), w13_q, w2_q, topk_weights, topk_ids, None, w13_s, w2_s, 0.0, exact,
                      Fp8Path.DEQUANTISED)
        cases = {
            "bf16 weights": (w13, w2, None, None, Fp8Path.UNQUANTISED, 2),
            "fp8 dequantised (fp32)": (w13_q, w2_q, w13_s, w2_s, Fp8Path.DEQUANTISED, 1),
            "fp8 dots": (w13_q, w2_q, w13_s, w2_s, Fp8Path.FP8_DOTS, 1),
        }
        for name, (a, b, a_scale, b_scale, path, width) in cases.items():
            out = torch.empty(tokens, HIDDEN, device=device, dtype=torch.bfloat16)

            def call() -> None:
                run_fused_moe(hidden, a, b, topk_weights, topk_ids, None, a_scale, b_scale, 0.0, out, path)

            micros = triton.testing.do_bench(call, return_mode="median") * 1e3
            streamed = touched * 3 * HIDDEN * INTERMEDIATE * width
            error = f"{nmse(out, exact):.2e}" if path != Fp8Path.UNQUANTISED else "-"
            rate = streamed / micros / 1e3
            print(f"{tokens:>6} {name:<22} {micros:>10.1f} {streamed / 1e6:>10.1f} {rate:>8.0f} {error:>9}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
