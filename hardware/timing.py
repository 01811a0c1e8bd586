"""Latency and jitter bookkeeping for the control loop."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class LatencySummary:
    """Percentiles of one timing series, in milliseconds."""

    n: int
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    std_ms: float

    @classmethod
    def of(cls, seconds: list[float] | np.ndarray) -> LatencySummary:
        """Summarize a series given in seconds (all zeros for an empty series)."""
        x = np.asarray(seconds, dtype=np.float64) * 1e3
        if x.size == 0:
            return cls(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        p50, p95, p99 = np.percentile(x, [50, 95, 99])
        return cls(int(x.size), float(x.mean()), float(p50), float(p95), float(p99), float(x.max()), float(x.std()))

    def row(self, name: str) -> str:
        """A markdown table row ``| name | n | mean | p50 | p95 | p99 | max | std |``."""
        return (
            f"| {name} | {self.n} | {self.mean_ms:.2f} | {self.p50_ms:.2f} | {self.p95_ms:.2f} | "
            f"{self.p99_ms:.2f} | {self.max_ms:.2f} | {self.std_ms:.2f} |"
        )


TABLE_HEADER = (
    "| series | n | mean ms | p50 ms | p95 ms | p99 ms | max ms | std ms |\n|---|---|---|---|---|---|---|---|"
)


@dataclass
class LoopTimer:
    """Keeps a fixed-rate schedule and records how well it was kept.

    Series (seconds): ``lateness`` (wake-up time minus scheduled tick: the
    jitter), ``period`` (time between consecutive ticks), ``compute`` (work
    done per tick), ``obs_age`` (age of the joint state used), ``send``
    (adapter publish time), ``policy`` (per policy call).
    """

    dt: float
    series: dict[str, list[float]] = field(
        default_factory=lambda: {k: [] for k in ("lateness", "period", "compute", "obs_age", "send", "policy")}
    )
    overruns: int = 0
    _t0: float = 0.0
    _step: int = -1
    _last_wake: float | None = None

    def start(self) -> None:
        """Anchor tick 0 at now."""
        self._t0 = time.perf_counter()
        self._step = -1
        self._last_wake = None

    def wait_next(self) -> int:
        """Sleep until the next tick and return its step index.

        If the loop fell behind by whole periods, the missed ticks are skipped
        (counted in :attr:`overruns`) instead of being run back to back.
        """
        target = self._step + 1
        tick = self._t0 + target * self.dt
        now = time.perf_counter()
        if now < tick:
            time.sleep(tick - now)
            now = time.perf_counter()
        behind = int((now - self._t0) / self.dt) - target
        if behind > 0:
            self.overruns += behind
            target += behind
            tick = self._t0 + target * self.dt
        self.series["lateness"].append(now - tick)
        if self._last_wake is not None:
            self.series["period"].append(now - self._last_wake)
        self._last_wake = now
        self._step = target
        return target

    def elapsed(self) -> float:
        """Seconds since :meth:`start`."""
        return time.perf_counter() - self._t0

    def summaries(self) -> dict[str, LatencySummary]:
        """One :class:`LatencySummary` per series."""
        return {k: LatencySummary.of(v) for k, v in self.series.items()}
