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
# in order of what matters most, so that a run cut short by its caller's
# limit still has the first steps' logs: the worker tests (-v: a killed
# step's log still names each test's outcome), the default transfer bench,
# the file tier beside vLLM's, then the rest
step worker-tests 240 "$PY" -m pytest -v -p no:cacheprovider -rs --maxfail=20 \
    --junit-xml "$OUT/worker.xml" tests/worker
# the default (zero-copy where the driver maps the CPU tier)
step bench-transfer 90 "$PY" -m kvoffload bench transfer --json "$OUT/transfer.json"
if [ -n "${KVOFFLOAD_VLLM_PATH:-}" ]; then
    # the file tier's C I/O, as the compiled build has it (no install here:
    # built into the checkout); without a compiler or Python's headers the
    # bench runs the Python I/O and its conditions line says so
    step build-chunkio 60 bash scripts/build_chunkio.sh
    step bench-tier-1 150 "$PY" -m kvoffload bench tier \
        --vllm-path "$KVOFFLOAD_VLLM_PATH" --sizes 256K,1M,4M \
        --json "$OUT/tier-1.json"
fi
if [ -n "${KVOFFLOAD_VLLM_DIRS:-}" ]; then
    step face-tests 60 "$PY" -m pytest -q -p no:cacheprovider -rs \
        tests/vllm/test_vllm_face.py -k "scheduler_sequence"
fi
# batched rows staged, then every row by kernels (no per-run DMA), each
# beside the default above
step bench-transfer-staged 60 "$PY" -m kvoffload bench transfer --zero-copy off \
    --json "$OUT/transfer-staged.json"
step bench-transfer-kernels 60 "$PY" -m kvoffload bench transfer \
    --direct-copy-min-bytes 1073741824 --json "$OUT/transfer-kernels.json"
if [ -n "${KVOFFLOAD_VLLM_PATH:-}" ]; then
    step bench-tier-2 150 "$PY" -m kvoffload bench tier \
        --vllm-path "$KVOFFLOAD_VLLM_PATH" --sizes 256K,1M,4M \
        --json "$OUT/tier-2.json"
fi
echo "== done, status $status"
exit $status
