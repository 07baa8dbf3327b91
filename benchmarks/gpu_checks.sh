#!/usr/bin/env bash
# The GPU checks and figures of BENCHMARKS.md, in one call, on a machine with a CUDA GPU:
#
#   bash benchmarks/gpu_checks.sh [OUTDIR]
#
# 1. bench_gram_gpu.py: the Gram engine's tiles against the GPU's own matmul, in and out
#    of core (20,000 x 64,896 float32);
# 2. the tests that need a GPU (they skip elsewhere) and the torch and chunk-reader tests;
# 3. bench_extract.py --gpus 1 --no-ray: the extraction shard on the GPU against a plain
#    torch loop on it.
# Needs no Ray. Wheels in .whl/ (packages the machine lacks, e.g. zarr) are installed into
# /tmp/site first when present. Logs and JSON results go to OUTDIR (default $OUT). Every
# step runs; the script exits 1 if any failed.
set -uo pipefail
failed=0
out=${1:-${OUT:-/tmp/gpu_checks}}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm \
    --format=csv | tee "$out/nvidia_smi.txt"
nproc | tee -a "$out/nvidia_smi.txt"
python3 benchmarks/bench_gram_gpu.py --out "$out/gram_gpu.json" 2>&1 | tee "$out/gram_gpu.log" \
    || failed=1
# (study specs need jsonschema, which such a machine may lack)
python3 -m pytest -q -p no:cacheprovider tests/test_gram_precision.py tests/test_chunk_files.py \
    -k "not study_spec" 2>&1 | tee "$out/pytest.log" || failed=1
python3 benchmarks/bench_extract.py --images 1000 --gpus 1 --no-ray \
    --json "$out/extract_gpu.json" 2>&1 | tee "$out/extract.log" || failed=1
exit $failed
