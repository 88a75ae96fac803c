"""Live MOPD and DeepSearch workloads (quick sizes) and the simulator check: correctness, not
speed. Every request is answered exactly once, no action is lost, the provider's 429s never
reach ARL-Tangram's trajectories, the teachers really swap, and nothing is left running
(the suite's ``no_leftovers`` fixture checks processes and temp dirs after each test)."""

from __future__ import annotations

import io
import math
import os
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from arl_tangram.bench.live import deepsearch, mopd, simcheck
from arl_tangram.bench.live.common import LiveOptions, Progress, SystemRun, WorkloadResult
from arl_tangram.bench.live.search_service import SearchService, ServiceSettings, build_corpus

QUICK = LiveOptions(quick=True, report_dir=None, seed=0)


def _check_run(run: SystemRun, num_actions: int) -> None:
    assert len(run.act_s) == len(run.queue_s) == len(run.exec_s) == len(run.overhead_s) == num_actions
    for act, queue, exec_s, overhead in zip(run.act_s, run.queue_s, run.exec_s, run.overhead_s, strict=True):
        assert min(queue, exec_s, overhead) >= 0
        assert act == pytest.approx(queue + exec_s + overhead, abs=1e-6)
    assert run.step_s > 0


def _check_simcheck(result: WorkloadResult) -> None:
    ratios = simcheck.run([result], QUICK)[result.name]
    assert math.isfinite(ratios["ratio"]) and ratios["ratio"] > 0
    assert ratios["live_mean_act_s"] == pytest.approx(result.run_of("tangram").mean_act_s)  # type: ignore[union-attr]


def test_search_service_enforces_its_limit_and_counts_violations() -> None:
    with tempfile.TemporaryDirectory(prefix=f"arl-tangram-{os.getpid()}-test-") as tmp:
        db = Path(tmp) / "corpus.db"
        assert build_corpus(db) == 164
        with SearchService(db, ServiceSettings(rate_per_s=1.0, burst=2.0, latency_s=0.0)) as svc:
            auth = {"Authorization": f"Bearer {svc.settings.key}"}
            with httpx.Client(base_url=svc.base_url) as client:
                answers = [client.post("/search", json={"q": "closer numbers threshold"}, headers=auth) for _ in range(4)]
                assert client.post("/search", json={"q": "list"}).status_code == 401
            assert [a.status_code for a in answers[:2]] == [200, 200]
            assert answers[0].json()["hits"][0]["title"] == "has_close_elements"
            rejected = [a for a in answers if a.status_code == 429]
            assert rejected and all(a.headers["Retry-After"].isdigit() for a in rejected)
            stats = svc.stats()
            assert stats["violations"] == len(rejected) and stats["accepted"] == 4 - len(rejected)
            time.sleep(1.2)  # a token back: the bad request passes the limit and is refused for its field
            bad = httpx.post(f"{svc.base_url}/search", json={"q": "list", "k": "x"}, headers=auth)
            assert bad.status_code == 400 and "k:" in bad.json()["error"]
            proc = svc.proc
        assert proc is not None and proc.poll() is not None  # the provider process is gone


def test_deepsearch_quick_answers_everything_without_leaking_429s() -> None:
    p = deepsearch.live_params(QUICK)
    plans = deepsearch.make_plans(p, QUICK.seed)
    searches = sum(len(plan.searches) for plan in plans)
    result = deepsearch.run(QUICK, Progress(io.StringIO()))
    assert result.name == "deepsearch" and {r.system for r in result.runs} == {"tangram", "semaphore"}
    for run in result.runs:
        _check_run(run, searches + len(plans))
    s = result.summary
    assert s["tangram_failed_actions"] == 0 and s["semaphore_failed_actions"] == 0
    assert s["leaked_429"] == 0 and result.run_of("tangram").leaked_429 == 0  # type: ignore[union-attr]
    assert s["quota_violations"] == 0
    assert s["tangram_provider_accepted"] == searches  # each query answered exactly once
    assert s["baseline_leaked_429"] == s["baseline_quota_violations"]  # every 429 it drew reached a trajectory
    assert 0 < s["tangram_mean_reward"] <= 1 and math.isfinite(s["act_gain"])
    assert result.fitted["provider_rate_per_s"] == p.rate_per_s and result.fitted["search_latency_s"] > 0
    _check_simcheck(result)


def test_mopd_quick_swaps_teachers_in_a_third_of_the_memory() -> None:
    p = mopd.live_params(QUICK)
    plans = mopd.make_plans(p, QUICK.seed)
    calls = sum(len(plan.calls) for plan in plans)
    assert len({plan.teacher for plan in plans}) > p.tangram_devices  # the stream cannot fit resident
    result = mopd.run(QUICK, Progress(io.StringIO()))
    assert result.name == "mopd" and {r.system for r in result.runs} == {"tangram", "static"}
    for run in result.runs:
        _check_run(run, calls)
    s = result.summary
    assert s["tangram_failed_actions"] == 0 and s["static_failed_actions"] == 0  # valid log-probs, every call
    assert sum(s["requests_per_teacher"]) == calls and len(s["requests_per_teacher"]) == 9
    assert 0 < s["tangram_device_bytes"] * 3 <= s["static_device_bytes"]
    assert s["swap_ins"] > 0  # more teachers than devices: Evict-on-Execution really swapped
    assert s["tangram_p50_ms"] > 0 and s["static_p50_ms"] > 0
    assert result.fitted["gpu_devices"] == p.tangram_devices and result.fitted["host_to_device_gbps"] > 0
    _check_simcheck(result)


def test_simcheck_fits_and_skips() -> None:
    mean, sigma = simcheck.fit_lognormal([1.0, math.e, 0.0, float("nan")])
    assert mean == pytest.approx((1 + math.e) / 2) and sigma == pytest.approx(0.5)
    assert simcheck.platform_latency_s([0.0, 0.1, 0.2, 0.3, 0.4], [0.0] * 5) == pytest.approx(0.0)
    lonely = WorkloadResult("mopd", [SystemRun("static", [1.0], [0.0], [1.0], [0.0], 1.0)], {}, {"batch": 1})
    assert simcheck.run([lonely], QUICK) == {}  # no tangram run: nothing to compare
