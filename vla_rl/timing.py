"""Where an iteration's time goes: named wall-clock totals, reported as ``time/*`` scalars.

Every part of the loop times its own stages with one :class:`StageTimes` and hands the totals on:
the rollout engine (``env``: waiting for the simulator, ``act``: the policy choosing chunks,
``value``: critic calls for bootstraps, ``reward``: reward terms and episode bookkeeping), the
policy-gradient update (``advantages``, ``forward``, ``backward``, ``optimizer``) and the trainer's
pipeline stages, timed by the :class:`StageTimer` hook (``rollout``, ``update``, ``eval``, ``log``,
``checkpoint``). :data:`BREAKDOWN` lists the scalars that partition an iteration, the stacked plot of
the run report and the progress bar read them.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

from vla_rl.distributed import SINGLE, Distributed
from vla_rl.hooks import Hook, IterationResult, RunContext

# The scalars that add up to an iteration's wall time (``time/iteration_s``), in plotting order.
BREAKDOWN = (
    "time/rollout_env_s",
    "time/rollout_act_s",
    "time/rollout_value_s",
    "time/rollout_other_s",
    "time/update_advantages_s",
    "time/update_forward_s",
    "time/update_backward_s",
    "time/update_optimizer_s",
    "time/update_other_s",
    "time/eval_s",
    "time/log_s",
    "time/checkpoint_s",
)


class StageTimes:
    """Accumulates wall-clock seconds per stage name until :meth:`take`."""

    def __init__(self) -> None:
        self._totals: defaultdict[str, float] = defaultdict(float)
        self._open: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        """Time the ``with`` block under ``name`` (nested blocks count in both names)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._totals[name] += time.perf_counter() - start

    def start(self, name: str) -> None:
        """Start timing ``name`` until :meth:`stop` (for stages that do not fit one ``with`` block)."""
        self._open[name] = time.perf_counter()

    def stop(self, name: str) -> None:
        """Add the seconds since :meth:`start` of ``name``."""
        self._totals[name] += time.perf_counter() - self._open.pop(name)

    def total(self, name: str) -> float:
        """The seconds of ``name`` since the last :meth:`take` (0 when it did not run)."""
        return self._totals.get(name, 0.0)

    def take(self, prefix: str = "") -> dict[str, float]:
        """The totals since the last call, as ``{prefix + name + '_s': seconds}``; resets them."""
        out = {f"{prefix}{k}_s": v for k, v in self._totals.items()}
        self._totals.clear()
        return out


def split_remainder(total: float, parts: dict[str, float], other: str) -> dict[str, float]:
    """``parts`` plus ``other`` = what of ``total`` they do not cover (never below 0)."""
    return {**parts, other: max(0.0, total - sum(parts.values()))}


def time_summary(scalars: dict[str, float]) -> str:
    """The progress bar's line: where the iteration's seconds went, e.g. ``env 0.8 act 0.3 upd 2.0 eval 0``."""
    parts = {
        "env": scalars.get("time/rollout_env_s"),
        "act": scalars.get("time/rollout_act_s"),
        "upd": scalars.get("time/update_s"),
        "eval": scalars.get("time/eval_s"),
        "ckpt": scalars.get("time/checkpoint_s"),
    }
    return " ".join(f"{k} {v:.1f}s" for k, v in parts.items() if v is not None and (v >= 0.05 or k in ("env", "upd")))


class StageTimer(Hook):
    """The trainer's ``time/*`` scalars: each pipeline stage's seconds, the rollout's and the update's own parts with
    what they leave over (``time/*_other_s``), env steps per second, and the whole iteration's wall time.

    Logging and checkpointing happen after an iteration's row is written, so their seconds are logged with the next
    iteration's row. Per-rank seconds are averaged over the ranks, env steps per second added up.
    """

    def __init__(self) -> None:
        self.times = StageTimes()
        self.dist: Distributed = SINGLE
        self._started = 0.0
        self._carried: dict[str, float] = {}

    def start(self, run: RunContext) -> None:
        self.dist = run.dist

    def before_iteration(self, iteration: int) -> None:
        totals = self.times.take("time/")  # the previous row's log and checkpoint (or the first evaluation)
        self._carried = {k: totals.get(k, 0.0) for k in ("time/log_s", "time/checkpoint_s")}
        self._started = time.perf_counter()

    def stage(self, name: str) -> contextlib.AbstractContextManager[None]:
        return self.times(name)

    def after_update(self, result: IterationResult) -> None:
        rollout_s, update_s = self.times.total("collect"), self.times.total("update")
        parts = {k: v for k, v in result.scalars.items() if k.startswith("time/update_")}
        own = {"time/rollout_s": rollout_s, "time/update_s": update_s,
               **split_remainder(update_s, parts, "time/update_other_s")}
        if result.rollout is not None:
            own.update(split_remainder(rollout_s, result.rollout.times, "time/rollout_other_s"))
            own["time/env_steps_per_s"] = result.rollout.env_steps / max(rollout_s, 1e-9)
        else:  # a dataset learner: drawing its batch
            own["time/rollout_other_s"] = rollout_s
        result.scalars.update(self.dist.merge_scalars(own, summed=("time/env_steps_per_s",)))

    def before_log(self, result: IterationResult) -> None:
        s = result.scalars
        s["time/eval_s"] = self.times.total("evaluate")
        s.update(self._carried)
        s["time/iteration_s"] = time.perf_counter() - self._started + s["time/log_s"] + s["time/checkpoint_s"]
