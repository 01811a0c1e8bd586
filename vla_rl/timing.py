"""Where an iteration's time goes: named wall-clock totals, reported as ``time/*`` scalars.

Every part of the loop times its own stages with one :class:`StageTimes` and hands the totals on:
the rollout engine (``env``: waiting for the simulator, ``act``: the policy choosing chunks,
``value``: critic calls for bootstraps, ``reward``: reward terms and episode bookkeeping), the
policy-gradient update (``advantages``, ``forward``, ``backward``, ``optimizer``) and the trainer
(``eval``, ``log``, ``checkpoint``). :data:`BREAKDOWN` lists the scalars that partition an iteration,
the stacked plot of the run report and the progress bar read them.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

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
