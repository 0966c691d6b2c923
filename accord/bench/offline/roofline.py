"""Batch-1 decode against the memory-bandwidth roofline: the device's copy bandwidth
(measured) and datasheet bandwidth, the weights decode streams per token, and the
shares of the rooflines each run reaches."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


#: Datasheet HBM bandwidth in bytes/s by device name (torch.cuda.get_device_name()
#: substring, most specific first); the roofline uses the measured copy bandwidth too.
HBM_BANDWIDTH = (
    ("H200", 4.8e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),
    ("A100-SXM4-80GB", 2.039e12),
    ("A100", 1.555e12),
    ("MI300X", 5.3e12),
)


@dataclass(frozen=True)
class DeviceSpec:
    """What the batch-1 roofline needs of a device: its name, measured copy bandwidth and
    datasheet memory bandwidth (bytes/s; None where the device is not in the table)."""

    name: str
    copy_bandwidth: float
    peak_bandwidth: float | None = None


def copy_bandwidth(device: str = "cpu", num_bytes: int = 1 << 28, repeats: int = 5) -> float:
    """Measured memory bandwidth of `device` in bytes/s: a large tensor copy (reads +
    writes), the best of `repeats`."""
    import torch

    source = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    target.copy_(source)
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * num_bytes / best


def datasheet_bandwidth(device_name: str) -> float | None:
    """The vendor's memory bandwidth (bytes/s) for a device named `device_name`, or None."""
    return next((bandwidth for key, bandwidth in HBM_BANDWIDTH if key in device_name), None)


def device_copy_bandwidth(device: str) -> float:
    """`copy_bandwidth` of the measuring device (GPUs get a 1 GiB copy, past any cache)."""
    return copy_bandwidth() if device == "cpu" else copy_bandwidth(device, num_bytes=1 << 30)


def device_spec(device: str, bandwidth: float) -> DeviceSpec:
    """The measuring device's name, its measured copy `bandwidth` and its datasheet one."""
    import platform

    import torch

    if device == "cpu":
        return DeviceSpec(platform.processor() or platform.machine(), bandwidth)
    name = torch.cuda.get_device_name()
    return DeviceSpec(name, bandwidth, datasheet_bandwidth(name))


def checkpoint_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape, by its Hugging Face name, in the checkpoint's safetensors files
    (or its GGUF file)."""
    from safetensors import safe_open

    from ...core.model_loader.gguf import is_gguf, open_gguf_model

    if is_gguf(model_dir):
        checkpoint = open_gguf_model(model_dir).checkpoint
        return {name: tuple(checkpoint.shape(name)) for name in checkpoint.names()}
    shapes: dict[str, tuple[int, ...]] = {}
    for path in model_dir.glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as checkpoint:
            for name in checkpoint.keys():
                shapes[name] = tuple(checkpoint.get_slice(name).get_shape())
    return shapes


def streamed_weights(model_dir: Path) -> int:
    """Weights batch-1 decode streams once per token: every tensor of the checkpoint,
    the embedding table excepted (one row is gathered) unless it doubles as the LM head."""
    shapes = checkpoint_shapes(model_dir)
    streamed = sum(math.prod(shape) for shape in shapes.values())
    if "lm_head.weight" in shapes:
        streamed -= math.prod(shapes["model.embed_tokens.weight"])
    return streamed


def roofline(weights: int, dtype_bytes: int, bandwidth: float) -> float:
    """Batch-1 decode tokens/s if `weights` elements of `dtype_bytes` each stream once per
    token at `bandwidth` bytes/s."""
    return bandwidth / (weights * dtype_bytes)


def roofline_figures(decode: float, weights: int, compute_bytes: int, spec: DeviceSpec) -> dict[str, float]:
    """Batch-1 `decode` tok/s and the rooflines it is held to, by name: at the measured
    copy bandwidth with the weights as computed and as bf16, and at the datasheet
    bandwidth (HBM on GPUs) when the device is known."""
    figures = {
        "decode_tokens_per_s": decode,
        "roofline_tokens_per_s": roofline(weights, compute_bytes, spec.copy_bandwidth),
        "roofline_bf16_tokens_per_s": roofline(weights, 2, spec.copy_bandwidth),
    }
    if spec.peak_bandwidth is not None:
        figures["roofline_datasheet_tokens_per_s"] = roofline(weights, compute_bytes, spec.peak_bandwidth)
    return figures


def run_bandwidths(measured: Sequence[float]) -> list[float]:
    """The copy bandwidth each batch-1 run is held to, from those measured before the
    first run and after each: the higher of the two around it (the best the memory did)."""
    return [max(before, after) for before, after in zip(measured, measured[1:])]


def batch1_figures(
    decode: Sequence[float], measured: Sequence[float], weights: int, compute_bytes: int, spec: DeviceSpec
) -> dict[str, object]:
    """`roofline_figures` of the median batch-1 `decode` rate at `spec` (whose copy
    bandwidth is the median of `run_bandwidths(measured)`); under "runs" each run's decode
    rate, the copies measured right before and after it, and its shares of the rooflines
    at its own bandwidth; and the median run's shares (the drift of the memory cancels
    out of each run's share, not out of the median rate against the median bandwidth)."""
    figures: dict[str, object] = dict(roofline_figures(statistics.median(decode), weights, compute_bytes, spec))
    runs = figures["runs"] = [
        {
            "decode_tokens_per_s": rate,
            "copy_bandwidth_before": before,
            "copy_bandwidth_after": after,
            "roofline_share": rate / roofline(weights, compute_bytes, held),
            "roofline_bf16_share": rate / roofline(weights, 2, held),
        }
        for rate, before, after, held in zip(decode, measured, measured[1:], run_bandwidths(measured))
    ]
    for share in ("roofline_share", "roofline_bf16_share"):
        figures[share] = statistics.median(run[share] for run in runs)
    return figures


def render_roofline(batch1: dict[str, object], compute: object, spec: DeviceSpec) -> str:
    """The batch-1 decode rate as a share of each roofline in `batch1` (roofline_figures,
    or batch1_figures: then the median of its runs, with each run's range)."""
    decode = batch1["decode_tokens_per_s"]
    runs = batch1.get("runs", [])
    if len(runs) > 1:
        rates = [run["decode_tokens_per_s"] for run in runs]

        def shares(key: str) -> str:
            low, high = min(run[key] for run in runs), max(run[key] for run in runs)
            return f"{batch1[key]:.0%} ({low:.0%}-{high:.0%})"

        lines = [
            f"batch-1 decode on {spec.name}: {decode:.1f} tok/s, the median of {len(runs)} runs "
            f"({min(rates):.1f}-{max(rates):.1f}); each run against the bandwidth roofline at the copy bandwidth "
            f"measured right around it (the higher of before and after), the median run: "
            f"{shares('roofline_share')} at the {compute} weights it streams, {shares('roofline_bf16_share')} "
            f"of the bf16 roofline",
            f"  at the median run's copy bandwidth, {spec.copy_bandwidth / 1e9:.1f} GB/s, the rooflines are "
            f"{batch1['roofline_tokens_per_s']:.1f} and {batch1['roofline_bf16_tokens_per_s']:.1f} tok/s",
        ]
    else:
        lines = [
            f"batch-1 decode on {spec.name}: {decode:.1f} tok/s = {decode / batch1['roofline_tokens_per_s']:.0%} "
            f"of the bandwidth roofline at the {compute} weights it streams ({batch1['roofline_tokens_per_s']:.1f} "
            f"tok/s at the measured copy bandwidth, {spec.copy_bandwidth / 1e9:.1f} GB/s); "
            f"{decode / batch1['roofline_bf16_tokens_per_s']:.0%} of the bf16 roofline "
            f"({batch1['roofline_bf16_tokens_per_s']:.1f} tok/s)"
        ]
    if "roofline_datasheet_tokens_per_s" in batch1:
        peak = batch1["roofline_datasheet_tokens_per_s"]
        lines.append(
            f"  {decode / peak:.0%} of the HBM roofline at the datasheet's {spec.peak_bandwidth / 1e12:.2f} TB/s "
            f"({peak:.1f} tok/s)"
        )
    return "\n".join(lines)
