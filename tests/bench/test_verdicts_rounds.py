"""``bench verdicts --rounds``: a run measured back to back on one server reports its worst round."""

from __future__ import annotations

import pytest

from arl_tangram.bench import verdicts


def _round(right: float, timeouts: int, p50: float, p99: float) -> dict[str, object]:
    return {"calls": 64, "right_verdicts_fraction": right, "client_timeouts": timeouts, "p50_s": p50, "p99_s": p99}


def test_one_round_is_reported_as_it_was() -> None:
    assert verdicts.worst_round([_round(1.0, 0, 5.0, 9.0)]) == _round(1.0, 0, 5.0, 9.0)


def test_each_figure_is_its_worst_round() -> None:
    rounds = [_round(1.0, 0, 5.0, 9.0), _round(0.625, 24, 4.0, 16.3), _round(0.98, 1, 6.0, 11.0)]
    worst = verdicts.worst_round(rounds)  # type: ignore[arg-type]
    assert (worst["right_verdicts_fraction"], worst["client_timeouts"], worst["p50_s"], worst["p99_s"]) == (0.625, 24, 6.0, 16.3)
    assert worst["rounds"] == rounds and worst["calls"] == 64


def test_rounds_must_be_at_least_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        verdicts.main(["--rounds", "0", "--json"])
    assert exc.value.code == 2
    assert "--rounds: must be an integer >= 1" in capsys.readouterr().err
