#!/usr/bin/env bash
# One prepared run of the GPU manager's checks and benchmark on a lent CUDA machine
# (the `device` tool: run this file as the command, timeout_s about 540). It uses the
# machine's own python3 (torch, transformers, safetensors, pytest, hypothesis are there);
# the MiniLM package is not, so the MiniLM tests are left out. Results land in $OUT.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/arl-tangram-device-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$OUT/gpu.txt"
timeout 240 python3 -m pytest tests/managers/gpu -q -p no:cacheprovider -k "not minilm and not paraphrase" 2>&1 | tee "$OUT/pytest.txt"
timeout 240 python3 -m arl_tangram.cli bench gpu --json --model-mb 1024 --teacher-mb 256 \
    --cache-dir /tmp/arl-tangram-models > "$OUT/bench_gpu.json" 2> "$OUT/bench_gpu.err"
echo "bench exit $?"; tail -5 "$OUT/bench_gpu.err"; cat "$OUT/bench_gpu.json"
