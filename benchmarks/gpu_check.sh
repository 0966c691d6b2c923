#!/usr/bin/env bash
# The GPU checks of issue 16, in one go on a lent GPU machine (the `device` tool's `run`):
# conformance of the cuda backend, the GPU tests, the fused_moe timings and
# `accord bench --backend cuda`, each under its own time limit, logs under $OUT.
#
#   here, once:   benchmarks/gpu_check.sh prepare
#                 (wheels of accord's dependencies the device image lacks, pinned to the
#                 versions installed here, into .whl/, which .gitignore ignores)
#   on the GPU:   run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=600)
#
# The device image has torch, triton, transformers, tokenizers and safetensors but not
# fastapi, uvicorn, pydantic, llguidance, gguf or jsonschema, and cannot download them.
# The stages fit ~9 minutes together; a stage that runs out its limit is logged and the
# next one starts. The summary (last lines of output, and $OUT/summary.txt) says which.
set -u
cd "$(dirname "$0")/.."

WHEELS=(fastapi starlette pydantic pydantic-core annotated-types typing-inspection uvicorn llguidance gguf
        jsonschema jsonschema-specifications referencing rpds-py)

if [ "${1:-}" = "prepare" ]; then
    specs=$(python3 -c "import importlib.metadata as m, sys; print(*(f'{n}=={m.version(n)}' for n in sys.argv[1:]))" \
        "${WHEELS[@]}")
    mkdir -p .whl
    # The device runs CPython 3.12 on x86-64 Linux (glibc 2.39).
    exec python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_39_x86_64 --platform any -d .whl $specs
fi

if ! python3 -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "gpu_check.sh runs on a GPU machine (torch sees no GPU here); 'prepare' is the step for this machine" >&2
    exit 2
fi
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
summary="$OUT/summary.txt"
: >"$summary"

stage() {  # stage NAME LIMIT_S COMMAND...: run it with a time limit, log to $OUT/NAME.log
    local name=$1 limit=$2 started=$SECONDS
    shift 2
    echo "== $name (limit ${limit}s): $*"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$OUT/$name.log"
    echo "$name: rc=$rc in $((SECONDS - started)) s" | tee -a "$summary"
}

if [ -d .whl ]; then
    python3 -m pip install --quiet --no-index --no-deps .whl/*.whl >"$OUT/pip.log" 2>&1 ||
        echo "pip install of .whl failed: see pip.log" | tee -a "$summary"
fi
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda,
                                            'triton', triton.__version__)"
} 2>&1 | tee -a "$summary"

stage conformance 150 python3 -m accord.cli.main conformance --backend cuda
stage gpu_tests 60 python3 -m pytest -q -n 0 -p no:cacheprovider tests/triton/test_triton_gpu_backends.py \
    tests/backends tests/graphs
stage bench 240 python3 -m accord.cli.main bench --backend cuda --num-requests 64 --hf-requests 32 \
    --json "$OUT/bench.json"
stage fused_moe 90 python3 benchmarks/fused_moe_gpu.py --tokens 1,256
echo "== summary"
cat "$summary"
