#!/usr/bin/env bash
# The one prepared run of the GPU manager's checks and benchmark on a lent CUDA machine
# (one H100/H200-class GPU; the `device` tool: run this file, timeout_s about 540).
# Usage: scripts/device_gpu_check.sh --out DIR
# Fails (non-zero) on any error: a failing test, a failing bench, a missing GPU. Uses the
# machine's python3 (torch, transformers, safetensors, pytest, hypothesis); the MiniLM
# package may be missing there, so MiniLM tests are left out. Budget: tests <= 150 s,
# bench <= 300 s, model generation included (cached under /tmp).
set -euo pipefail
OUT=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) OUT="$2"; shift 2 ;;
        *) echo "unknown argument: $1 (usage: $0 --out DIR)" >&2; exit 2 ;;
    esac
done
[[ -n "$OUT" ]] || { echo "usage: $0 --out DIR" >&2; exit 2; }
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 ARL_TANGRAM_TEST_CUDA=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA'; print('torch', torch.__version__)" \
    | tee -a "$OUT/gpu.txt"
status=0
# GPU tests on CUDA arenas, cross-device routing on cuda:0 + cpu, memory back to baseline.
timeout 150 python3 -m pytest tests/managers/gpu -q -p no:cacheprovider \
    -k "not minilm and not paraphrase and not two_replicas_of_one_service and not real_models \
        and not every_module_runs and not bench" 2>&1 | tee "$OUT/pytest.txt" || status=$?
timeout 150 python3 -m pytest tests/managers/gpu/test_cuda.py -q -p no:cacheprovider 2>&1 \
    | tee "$OUT/pytest_cuda.txt" || status=$?
# Realistic sizes: a 4 GB bf16 teacher for swap/cold load, 1 GiB services for the stall test.
timeout 300 python3 -m arl_tangram.cli bench gpu --json --model-mb 4000 --dtype bfloat16 \
    --teacher-mb 256 --repeats 3 --mopd-requests 200 --churn-steps 1500 --churn-scale 16 \
    --cache-dir /tmp/arl-tangram-models > "$OUT/bench_gpu.json" 2> "$OUT/bench_gpu.err" \
    || status=$?
tail -5 "$OUT/bench_gpu.err"
python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$OUT/bench_gpu.json" || status=1
echo "device_gpu_check: exit $status"
exit "$status"
