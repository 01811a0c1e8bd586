"""What a run's process reward model paid per episode, successful and failed.

Reads the reward traces a run wrote (``<run>/reward_terms/iter_<k>.pt``, ``--reward.save_terms_every``): each
holds the episodes that ended in that iteration with their return and success. In a run rewarded
``{success: a, prm: w}`` an episode's PRM payment (at its weight) is its return less ``a`` times its success.
Under GAE the ``potential`` form is a change of the critic's baseline except at a terminating step
(docs/rewards.md), so the split of that payment between successes and failures is the part of the term no
critic absorbs: where failures are paid alike (``p_f``, a small spread) and successes ``a + p_s``, the term is,
once the critic has learned, the sparse reward with a success worth ``a + p_s - p_f``, a constant scale under
which AdamW takes the same steps.

    python benchmarks/prm_payments.py RUN_DIR [RUN_DIR ...] --every 10

Published by ``benchmarks/harness.py``.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path
from typing import Any

import harness


def payments(run: Path, every: int = 1) -> dict[str, Any]:
    """Per-episode PRM payments of ``run``, from every ``every``-th reward trace (read by
    :func:`vla_rl.reweigh.load_reward_trace`): mean and sd over successful and over failed episodes, the weights,
    and the iterations read.

    Raises:
        ValueError: naming the run when it has no traces, or the trace whose weights are not ``success`` and
            ``prm`` alone (:class:`vla_rl.reweigh.ReweighError`, a ValueError, for a file that is no trace).
    """
    from vla_rl.reweigh import TRACE_DIR, load_reward_trace

    traces = sorted((run / TRACE_DIR).glob("iter_*.pt"))[::every]
    if not traces:
        raise ValueError(f"{run}: no reward traces under {TRACE_DIR}/ (run with --reward.save_terms_every 1)")
    paid: dict[bool, list[float]] = {True: [], False: []}
    weights: dict[str, set[float]] = {"success": set(), "prm": set()}
    for path in traces:
        rollout, _, trace_weights = load_reward_trace(path)
        terms = dict(trace_weights)
        if set(terms) != set(weights):
            raise ValueError(f"{path}: weights {terms} are not {{success, prm}}; the payment is read as the return "
                             "less the success term")
        for name, w in terms.items():
            weights[name].add(w)
        for ep in rollout.episodes:
            paid[bool(ep.success)].append(ep.ret - terms["success"] * float(ep.success))
    return {"run": str(run), "traces": len(traces), "every": every, "success_weights": sorted(weights["success"]),
            "prm_weights": sorted(weights["prm"]),
            **{f"{name}_{stat}": fn(paid[ok]) for ok, name in ((True, "success"), (False, "failure"))
               for stat, fn in (("mean", _mean), ("sd", _sd), ("n", len))}}


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else math.nan


def _sd(xs: list[float]) -> float:
    return statistics.pstdev(xs) if len(xs) > 1 else math.nan


def render(rows: list[dict[str, Any]]) -> str:
    """The table and how to read it: a row per run."""
    lines = ["Each run's reward traces (every `--every`-th iteration) hold the episodes "
             "that ended in it; an episode's PRM payment at its weight is its return less its success term. Under "
             "GAE the potential form only moves the critic's baseline except at a terminating step "
             "(docs/rewards.md), so this split is what no critic absorbs.", "",
             "| run | prm weight | success: paid (sd, n) | failure: paid (sd, n) | success worth |",
             "|---|---:|---|---|---:|"]
    for r in rows:
        one = len(r["success_weights"]) == 1  # a success weight that moved over the run has no one worth
        worth = f"{r['success_weights'][0] + r['success_mean'] - r['failure_mean']:.2f}" if one else "-"
        w = "/".join(f"{x:g}" for x in r["prm_weights"])
        lines.append(f"| `{Path(r['run']).name}` | {w} | {r['success_mean']:.3f} ({r['success_sd']:.3f}, "
                     f"{r['success_n']}) | {r['failure_mean']:.3f} ({r['failure_sd']:.3f}, {r['failure_n']}) | "
                     f"{worth} |")
    lines += ["", "`success worth`: the success weight plus the mean payment of a success less that of a failure, "
              "the success reward's scale once the critic has fit the shaped returns."]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run folders of PRM + success runs")
    p.add_argument("--every", type=int, default=1, help="read every N-th reward trace")
    args = harness.add_output_args(p).parse_args()
    rows = [payments(run, args.every) for run in args.runs]
    for r in rows:
        print(f"{Path(r['run']).name}: success {r['success_mean']:.3f} (n={r['success_n']}), "
              f"failure {r['failure_mean']:.3f} (sd {r['failure_sd']:.3f}, n={r['failure_n']})")
    harness.publish("prm_payments", args, render(rows), rows=rows)


if __name__ == "__main__":
    main()
