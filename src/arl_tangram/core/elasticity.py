"""Core: elasticity models, the duration of an action as a function of its DoP.

The paper's formulation: with ``m`` units of the key resource an action takes
``T(m) = T_ori / (E(m) * m)`` where ``0 < E(m) <= 1`` is the parallel efficiency and
``T_ori`` the duration on one unit. Every model here exposes ``speedup(m) = E(m) * m``.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field

from arl_tangram.core.errors import SpecError


class ElasticityModel(abc.ABC):
    """Interface: ``speedup(m)`` for integer ``m >= 1``; ``speedup(1) == 1`` by convention."""

    @abc.abstractmethod
    def speedup(self, dop: int) -> float:
        """E(m) · m: how many times faster than on one unit."""

    def duration_s(self, t_ori_s: float, dop: int) -> float:
        return t_ori_s / self.speedup(dop)

    def efficiency(self, dop: int) -> float:
        return self.speedup(dop) / dop


@dataclass(frozen=True)
class NonElastic(ElasticityModel):
    """A single command: more units do not make it faster (E(m)·m flat)."""

    def speedup(self, dop: int) -> float:
        return 1.0


@dataclass(frozen=True)
class Amdahl(ElasticityModel):
    """Amdahl's law with serial fraction ``serial_fraction`` in [0, 1]."""

    serial_fraction: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.serial_fraction) or not 0.0 <= self.serial_fraction <= 1.0:
            raise SpecError("elasticity.serial_fraction", "must be a finite number in [0, 1]", self.serial_fraction)

    def speedup(self, dop: int) -> float:
        s = self.serial_fraction
        return 1.0 / (s + (1.0 - s) / dop)


@dataclass(frozen=True)
class Table(ElasticityModel):
    """Profiled efficiencies ``E(m)`` for m = 1..len(table); beyond the table E stays at its last value.

    E need not be monotone, which is why allocation over tables falls back to a DP.
    """

    efficiencies: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.efficiencies:
            raise SpecError("elasticity.efficiencies", "must hold at least E(1)", self.efficiencies)
        for i, e in enumerate(self.efficiencies):
            if not math.isfinite(e) or not 0.0 < e <= 1.0:
                raise SpecError(f"elasticity.efficiencies[{i}]", "must be finite and in (0, 1]", e)

    def speedup(self, dop: int) -> float:
        e = self.efficiencies[min(dop, len(self.efficiencies)) - 1]
        return e * dop


@dataclass
class Learned(ElasticityModel):
    """Amdahl fit learned online from observed (dop, duration) pairs of one action kind.

    Starts from ``prior_serial_fraction``; ``observe`` updates a running least-squares fit of
    ``T(m) = a + b/m`` (a = serial time, b = parallel time), which is Amdahl's law.
    Mutable by design: it is per-kind learned state, owned by the estimator.
    """

    prior_serial_fraction: float = 0.5
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # n, Σx, Σx², Σy, Σxy with x=1/m

    def observe(self, dop: int, duration_s: float) -> None:
        if dop < 1 or not math.isfinite(duration_s) or duration_s <= 0:
            return
        x = 1.0 / dop
        n, sx, sxx, sy, sxy = self._sums
        self._sums = [n + 1, sx + x, sxx + x * x, sy + duration_s, sxy + x * duration_s]

    def serial_fraction(self) -> float:
        n, sx, sxx, sy, sxy = self._sums
        denom = n * sxx - sx * sx
        if n < 2 or denom <= 1e-12:
            return self.prior_serial_fraction
        b = (n * sxy - sx * sy) / denom
        a = (sy - b * sx) / n
        a, b = max(a, 0.0), max(b, 0.0)
        return a / (a + b) if a + b > 0 else self.prior_serial_fraction

    def speedup(self, dop: int) -> float:
        s = self.serial_fraction()
        return 1.0 / (s + (1.0 - s) / dop)
