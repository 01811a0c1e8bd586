"""GRAPE's pairs: which scored trajectories of an initial state are preferred to which, and the round's table.

:func:`select_pairs` pairs the top-m with the bottom-m trajectories of each initial state;
:func:`instruction_pairs` contrasts a success with itself under another instruction;
:func:`write_pairs_table` writes a round's pairs as a parquet table (scores, costs per term, chosen /
rejected ids), atomically, and :func:`load_pairs` reads a written round's pairs back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vla_core.manifest import write_file_atomic
from vla_rl.grape.trajectory import PreferencePair, Trajectory, load_trajectories


def _ranked_by_state(trajs: Sequence[Trajectory]) -> dict[int, list[Trajectory]]:
    """Each initial state's trajectories, best score first (ties by id), states in order."""
    by_state: dict[int, list[Trajectory]] = {}
    for t in trajs:
        by_state.setdefault(t.state, []).append(t)
    return {s: sorted(by_state[s], key=lambda t: (-t.score, t.id)) for s in sorted(by_state)}


def distinct_instructions(instructions: Sequence[str]) -> list[str]:
    """``instructions`` without empty ones and repeats, in order."""
    return list(dict.fromkeys(c for c in instructions if c))


def select_pairs(trajs: Sequence[Trajectory], m: int, require_both_outcomes: bool = True,
                 within_outcome: bool = False, success_pairs: int = 0) -> list[PreferencePair]:
    """Pair the top-``m`` with the bottom-``m`` trajectories of each initial state by ``score``.

    Per state, trajectories are ranked by score (ties by id); pair ``i`` is (rank ``i`` from the top, rank
    ``i`` from the bottom) for ``i < min(m, n // 2)``, kept only when the chosen one scores strictly higher.
    A state whose trajectories all succeed or all fail gives no pair (GRAPE needs both) unless
    ``require_both_outcomes`` is false. ``within_outcome`` also pairs, in every state, its successes among
    themselves and its failures among themselves the same way (top-m against bottom-m of each outcome), so that
    the costs order trajectories of one outcome even where the state has both. ``success_pairs`` also pairs, in
    every state with both outcomes, each of its ``success_pairs`` best successes with one of its failures (the
    worst first, reused in turn when the state has fewer failures than successes): a state the policy mostly
    solves then gives each of its successes to the update, where top-m against bottom-m gives at most ``m``. A
    pair already formed is not repeated.

    Raises:
        ValueError: if ``m < 1`` or ``success_pairs < 0``.
    """
    if m < 1:
        raise ValueError(f"pairs per state must be >= 1, got {m}")
    if success_pairs < 0:
        raise ValueError(f"success pairs per state must be >= 0, got {success_pairs}")
    pairs: list[PreferencePair] = []
    for state, ranked in _ranked_by_state(trajs).items():
        both = len({t.success for t in ranked}) == 2
        groups = [] if require_both_outcomes and not both else [ranked]
        if within_outcome:
            groups += [[t for t in ranked if t.success == outcome] for outcome in (True, False)]
        candidates = [(g[i], g[-1 - i]) for g in groups for i in range(min(m, len(g) // 2))]
        if success_pairs and both:
            wins, losses = [t for t in ranked if t.success], [t for t in reversed(ranked) if not t.success]
            candidates += [(w, losses[i % len(losses)]) for i, w in enumerate(wins[:success_pairs])]
        seen: set[tuple[int, int]] = set()
        for best, worst in candidates:
            if best.score > worst.score and (best.id, worst.id) not in seen:
                seen.add((best.id, worst.id))
                pairs.append(PreferencePair(state, best, worst))
    return pairs


def instruction_pairs(trajs: Sequence[Trajectory], instructions: Sequence[str], m: int,
                      task_key: str = "task") -> list[PreferencePair]:
    """Pairs that contrast a success under its own instruction with the same trajectory under another instruction.

    Per state, each of its ``m`` best-scored successes is chosen against a copy of itself whose decisions carry
    another of ``instructions`` (every distinct non-empty one but its own): the same motion, which under that
    instruction does the wrong task (on ``mujoco/pick-any``: lifts a cube the instruction does not name). The copy
    keeps the trajectory's id, sampler extras and costs, with ``success`` false; score it before writing it. TPO on
    such a pair raises ``log pi(tau | c) - log pi(tau | c')``: it teaches which instruction a motion belongs to,
    which GRAPE's pairs of one instruction cannot, in states where the policy always goes for the wrong object.

    Raises:
        ValueError: if ``m < 1``.
    """
    if m < 1:
        raise ValueError(f"instruction pairs per state must be >= 1, got {m}")
    names = distinct_instructions(instructions)
    pairs: list[PreferencePair] = []
    for state, ranked in _ranked_by_state(trajs).items():
        for t in [t for t in ranked if t.success][:m]:
            own = t.obs[task_key]
            for c in names:
                if c in own:
                    continue
                swapped = dataclasses.replace(t, obs={**t.obs, task_key: [c] * len(own)}, success=False,
                                              score_parts={})
                pairs.append(PreferencePair(state, t, swapped))
    return pairs


def pairs_rows(pairs: Sequence[PreferencePair], cost_names: Sequence[str]) -> list[dict[str, Any]]:
    """One row per pair: state, chosen / rejected ids, scores, successes, steps, instructions (of the first
    decision; they differ in an :func:`instruction_pairs` pair, whose ids are equal) and each cost's totals."""
    rows = []
    for p in pairs:
        row: dict[str, Any] = {"state": p.state, "seed": p.chosen.seed}
        for side, t in (("chosen", p.chosen), ("rejected", p.rejected)):
            task = t.obs.get("task")
            row.update({f"{side}_id": t.id, f"{side}_score": t.score, f"{side}_success": t.success,
                        f"{side}_steps": t.steps, f"{side}_task": str(task[0]) if task else ""})
            row.update({f"{side}_{k}": float(v) for k, v in t.score_parts.items()})
            row.update({f"{side}_cost_{c}": float(t.costs.get(c, 0.0)) for c in cost_names})
        rows.append(row)
    return rows


def write_pairs_table(path: str | Path, pairs: Sequence[PreferencePair], cost_names: Sequence[str]) -> Path:
    """Write the pairs (:func:`pairs_rows`) as a parquet table at ``path``, atomically (tmp, fsync, rename)."""
    import pandas as pd

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = None if pairs else ["state", "seed", "chosen_id", "rejected_id", "chosen_score", "rejected_score"]
    table = pd.DataFrame(pairs_rows(pairs, cost_names), columns=columns)
    write_file_atomic(path, lambda f: table.to_parquet(f, index=False))
    return path


def load_pairs(round_dir: Path) -> list[PreferencePair]:
    """The pairs of a written round (``pairs.parquet``, trajectories re-linked by id from ``trajectories.pt``),
    without instruction pairs: both sides of one are the same trajectory. Empty when the round wrote no pair."""
    import pandas as pd

    if not (round_dir / "pairs.parquet").exists():
        return []
    table = pd.read_parquet(round_dir / "pairs.parquet")
    if table.empty:
        return []
    by_id = {t.id: t for t in load_trajectories(round_dir / "trajectories.pt")}
    return [PreferencePair(int(r.state), by_id[int(r.chosen_id)], by_id[int(r.rejected_id)])
            for r in table.itertuples() if int(r.chosen_id) != int(r.rejected_id)]
