#!/usr/bin/env bash
# The one prepared run of the GPU manager's checks and benchmark on a lent CUDA machine
# (one H100/H200-class GPU). With the `device` tool, from the repo root:
#   run(command="bash scripts/device_gpu_check.sh --out $OUT", timeout_s=540)
# Usage: scripts/device_gpu_check.sh --out DIR
#
# Fails (non-zero) on any error: no GPU, a failing or timed-out test, CUDA tests that were
# skipped instead of run, a failing or timed-out bench, a JSON without the issue's keys.
# Budget, worst case (every step ends at its timeout): 60 + 140 + 10 + 250 + 10 = 470 s < 8 min
# (expected: about 60 s of tests and 160 s of bench; `phase_s` in the JSON says where it went).
#
# Python: the machine's python3, no venv. That machine cannot fetch packages, so a venv with
# the project's pinned torch (pyproject: torch==2.13.0, a CPU build here) cannot be built
# there; its image ships a CUDA torch (2.11 when last seen), transformers, safetensors,
# pytest, pytest-timeout, hypothesis, psutil, httpx and numpy, and the project runs from
# source (PYTHONPATH=src). The versions used are written to versions.txt. MiniLM's package
# (88 MB, over what a run carries) is missing there: MiniLM tests skip themselves; the
# cross-device routing test runs on the generated teacher.
#
# Files written to DIR: versions.txt, pytest.txt, pytest.xml, bench_gpu.json,
# bench_gpu.err, steps.txt (seconds per step and exit codes).
set -euo pipefail
OUT=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) OUT="${2:?--out needs a directory}"; shift 2 ;;
        *) echo "unknown argument: $1 (usage: $0 --out DIR)" >&2; exit 2 ;;
    esac
done
[[ -n "$OUT" ]] || { echo "usage: $0 --out DIR" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # absolute: the next line changes directory
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 ARL_TANGRAM_TEST_CUDA=1
PY=python3
status=0
exec 3>&1  # the console: a step's own stdout/stderr may be redirected to its result files

step() {  # step NAME TIMEOUT_S CMD...: run with a timeout, record seconds and exit code
    local name=$1 limit=$2 started=$SECONDS rc=0
    shift 2
    timeout --kill-after=10 "$limit" "$@" || rc=$?
    echo "$name rc=$rc seconds=$((SECONDS - started))" | tee -a "$OUT/steps.txt" >&3
    if [[ $rc -ne 0 ]]; then status=$rc; fi
    return 0
}

# 1. The GPU and the software (fails at once without CUDA: nothing else is worth running).
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
    | tee "$OUT/versions.txt"
timeout 60 "$PY" - <<'EOF' | tee -a "$OUT/versions.txt"  # a cold first torch import is slow
import sys, torch, transformers, safetensors, pytest
assert torch.cuda.is_available(), "torch sees no CUDA device"
assert tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 4), torch.__version__
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "transformers", transformers.__version__, "safetensors", safetensors.__version__,
      "pytest", pytest.__version__, "gpu", torch.cuda.get_device_name(0))
EOF

# 2. The GPU tests on CUDA arenas (conftest: every budget an arena on cuda:0), test_cuda.py
#    (memory back to baseline after evict and close; cuda:0 + cpu split), cross-device routing
#    on cuda:0 + cpu. One run; each test bounded by pytest-timeout, the whole by timeout.
step pytest 140 "$PY" -m pytest tests/managers/gpu -q -p no:cacheprovider --timeout=120 \
    --junitxml="$OUT/pytest.xml" > "$OUT/pytest.txt" 2>&1
tail -15 "$OUT/pytest.txt"
# The CUDA-only tests must have run, not skipped (a torch without CUDA would skip them).
step cuda_tests_ran 10 "$PY" - "$OUT/pytest.xml" <<'EOF'
import sys, xml.etree.ElementTree as ET
cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
ran = {c.get("name") for c in cases if c.find("skipped") is None}
need = ["test_memory_returns_to_baseline_after_evict_and_close",
        "test_split_over_cuda_and_cpu_matches_whole",
        "test_every_module_runs_on_its_own_device[cuda+cpu]"]
missing = [n for n in need if n not in ran]
print("CUDA tests run:", "all" if not missing else f"MISSING {missing}")
sys.exit(1 if missing else 0)
EOF

# 3. The bench at realistic sizes: a 4 GB bf16 teacher for swap-in vs raw copy (20 interleaved
#    rounds after 2 warm-up rounds: about 8 s at 25 GB/s) vs cold load (3 repeats),
#    1 GB services for the loop-stall test, 9 x 256 MB teachers for MOPD. The fragmentation
#    churn runs on a CPU arena whatever the machine (shapes scaled down, ratio scale-free):
#    default scale. Models are generated (seeded) under /tmp, about 7 GB of disk.
step bench 250 "$PY" -m arl_tangram.cli bench gpu --json --model-mb 4000 --dtype bfloat16 \
    --teacher-mb 256 --repeats 3 --mopd-requests 200 --swap-mb 1024 --stall-s 10 \
    --cache-dir /tmp/arl-tangram-models > "$OUT/bench_gpu.json" 2> "$OUT/bench_gpu.err"
tail -12 "$OUT/bench_gpu.err"
step bench_json 10 "$PY" - "$OUT/bench_gpu.json" <<'EOF'
import json, sys
result = json.load(open(sys.argv[1]))
keys = ["swap_efficiency", "swap_efficiency_p25", "swap_efficiency_p75",
        "swap_efficiency_rounds", "swap_vs_cold", "fragmentation_largest_free_extent_ratio",
        "loop_stall_p99_ms", "resident_call_slowdown_during_swaps", "targets", "phase_s"]
missing = [k for k in keys if k not in result]
assert not missing, f"bench JSON lacks {missing}"
assert result["device"].startswith("cuda:0"), f"bench ran on {result['device']}, not CUDA"
print({k: result[k] for k in keys})
EOF

echo "device_gpu_check: exit $status" >> "$OUT/steps.txt"
cat "$OUT/steps.txt"
exit "$status"
