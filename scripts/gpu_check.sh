#!/usr/bin/env bash
# The worker side's checks on a CUDA machine, as one run: the worker tests
# (their CUDA cases run where torch sees a GPU), the 0.33 face's scheduler
# sequence on CUDA when a vLLM 0.33 release is extracted under
# $KVOFFLOAD_VLLM_DIRS, `bench transfer` on the GPU, and, when
# $KVOFFLOAD_VLLM_PATH names a vLLM 0.33 release, two runs of `bench tier`
# beside vLLM's fs tier on that machine's disk (the file tier's C I/O built
# into the checkout first, scripts/build_chunkio.sh). Needs torch with
# CUDA plus the package's dependencies; no install: it runs from the
# checkout. Writes its logs and the benchmark's JSON under $OUT (default
# /tmp/kvoffload-gpu-check). Exit status: non-zero if a step failed.
#
#   bash scripts/gpu_check.sh            # in the repository root
set -u -o pipefail
OUT=${OUT:-/tmp/kvoffload-gpu-check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
status=0
step() {  # step NAME SECONDS CMD...: run one step with a time limit, log it
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date -u +%T))"
    if ! timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.txt"; then
        echo "== $name FAILED"
        status=1
    fi
}
step env 60 bash -c "nvidia-smi -L; $PY -c 'import sys, torch, hypothesis, attrs, numpy; \
print(sys.version.split()[0], \"torch\", torch.__version__, \"cuda\", torch.cuda.is_available(), \
torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"-\", \"hypothesis\", \
hypothesis.__version__, \"attrs\", attrs.__version__, \"numpy\", numpy.__version__)'"
step worker-tests 300 "$PY" -m pytest -q -p no:cacheprovider -rs --maxfail=20 \
    --junit-xml "$OUT/worker.xml" tests/worker
if [ -n "${KVOFFLOAD_VLLM_DIRS:-}" ]; then
    step face-tests 120 "$PY" -m pytest -q -p no:cacheprovider -rs \
        tests/vllm/test_vllm_face.py -k "scheduler_sequence"
fi
# the default (zero-copy where the driver maps the CPU tier), then batched
# rows staged, then every row by kernels (no per-run DMA): side by side
step bench-transfer 240 "$PY" -m kvoffload bench transfer --json "$OUT/transfer.json"
step bench-transfer-staged 240 "$PY" -m kvoffload bench transfer --zero-copy off \
    --json "$OUT/transfer-staged.json"
step bench-transfer-kernels 240 "$PY" -m kvoffload bench transfer \
    --direct-copy-min-bytes 1073741824 --json "$OUT/transfer-kernels.json"
if [ -n "${KVOFFLOAD_VLLM_PATH:-}" ]; then
    # the file tier's C I/O, as the compiled build has it (no install here:
    # built into the checkout); without a compiler or Python's headers the
    # bench runs the Python I/O and its conditions line says so
    step build-chunkio 60 bash scripts/build_chunkio.sh
    for run in 1 2; do
        step "bench-tier-$run" 180 "$PY" -m kvoffload bench tier \
            --vllm-path "$KVOFFLOAD_VLLM_PATH" --sizes 256K,1M,4M \
            --json "$OUT/tier-$run.json"
    done
fi
echo "== done, status $status"
exit $status
