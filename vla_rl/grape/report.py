"""What ``vla-rl align`` reports per round and per run: evaluation summaries, logged scalars, the round's line,
its LeRobotDataset, plots, videos of a chosen and a rejected trajectory, and the report."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sim.core import EnvSpec
from sim.dataset import EpisodeRecorder
from sim.video import VideoWriter
from vla_core.manifest import write_text_atomic
from vla_rl.evaluation import wilson_interval
from vla_rl.grape.trajectory import PreferencePair, Trajectory
from vla_rl.report import stack_times, write_report_md

ROUND_TIMES = (
    ("env", "time/sample_env_s"),
    ("act", "time/sample_act_s"),
    ("score", "time/sample_other_s"),
    ("write", "time/write_s"),
    ("update", "time/update_s"),
    ("eval", "time/eval_s"),
    ("ckpt", "time/checkpoint_s"),
)
"""Where a round's wall time goes (label, ``time/*`` key of a round row's ``time``): sampling split into the envs
stepping, the policy acting and the rest (building, scoring and pairing trajectories), writing the round's files,
the TPO update, the evaluation after it and the checkpoint."""


def summarize(trajs: list[Trajectory], costs: list[str]) -> dict[str, Any]:
    """Success rate with its 95% Wilson interval, each cost's mean per episode, the collision rate (episodes
    with any collision step), the mean steps of successful episodes, and each episode's seed, success and
    steps, and whether it collided when ``collision`` is among ``costs`` (``per_episode``: what
    :func:`shared_success_steps` and :func:`collisions_by_outcome` read)."""
    n = len(trajs)
    wins = sum(t.success for t in trajs)
    lo, hi = wilson_interval(wins, n)
    out: dict[str, Any] = {"episodes": n, "success": wins / n if n else 0.0, "success_ci": [lo, hi]}
    out["costs"] = {c: sum(t.costs[c] for t in trajs) / n if n else 0.0 for c in costs}
    if "collision" in costs:
        out["collision_rate"] = sum(t.costs["collision"] > 0 for t in trajs) / n if n else 0.0
    steps = [t.steps for t in trajs if t.success]
    out["mean_steps_success"] = sum(steps) / len(steps) if steps else None
    out["mean_steps"] = sum(t.steps for t in trajs) / n if n else 0.0
    out["per_episode"] = {"seed": [int(t.seed) for t in trajs], "success": [bool(t.success) for t in trajs],
                          "steps": [int(t.steps) for t in trajs]}
    if "collision" in costs:
        out["per_episode"]["collided"] = [bool(t.costs["collision"] > 0) for t in trajs]
    return out


def collisions_by_outcome(ev: dict[str, Any]) -> dict[str, tuple[int, int]] | None:
    """``{"successes": (colliding, episodes), "failures": (colliding, episodes)}`` of an evaluation (:func:`summarize`),
    or None without per-episode collision records. A collision rate that stays flat while success rises can be
    fewer colliding failures and more colliding successes; this tells them apart."""
    rec = ev.get("per_episode") or {}
    if "collided" not in rec:
        return None
    out = {}
    for name, outcome in (("successes", True), ("failures", False)):
        hits = [c for ok, c in zip(rec["success"], rec["collided"]) if ok == outcome]
        out[name] = (sum(hits), len(hits))
    return out


def shared_success_steps(before: dict[str, Any], after: dict[str, Any]) -> tuple[int, float | None, float | None]:
    """``(states, mean steps before, mean steps after)`` over the initial states (seeds) that both evaluations
    (:func:`summarize` outputs) solved.

    The mean steps of successful episodes mixes two effects when success changes: a policy that also solves
    harder states, which take longer, raises it even if it got faster on every state it solved before. On
    the states solved both times it measures speed alone. ``(0, None, None)`` when no state was solved
    twice or an evaluation has no ``per_episode`` record (reports written before it existed).
    """
    solved = []
    for ev in (before, after):
        rec = ev.get("per_episode")
        if not rec:
            return 0, None, None
        solved.append({seed: steps for seed, ok, steps in zip(rec["seed"], rec["success"], rec["steps"]) if ok})
    shared = sorted(set(solved[0]) & set(solved[1]))
    if not shared:
        return 0, None, None
    return (len(shared), sum(solved[0][k] for k in shared) / len(shared),
            sum(solved[1][k] for k in shared) / len(shared))


def eval_scalars(ev: dict[str, Any]) -> dict[str, float]:
    """An evaluation (:func:`summarize`) as logged scalars (``eval/*``)."""
    out = {"eval/success": ev["success"], "eval/success_ci_low": ev["success_ci"][0],
           "eval/success_ci_high": ev["success_ci"][1]}
    out.update({f"eval/cost_{k}": v for k, v in ev["costs"].items()})
    if "collision_rate" in ev:
        out["eval/collision_rate"] = ev["collision_rate"]
    if ev["mean_steps_success"] is not None:
        out["eval/mean_steps_success"] = ev["mean_steps_success"]
    return out


def sample_scalars(row: dict[str, Any]) -> dict[str, float]:
    """The round's sampled (exploring) episodes: their success rate and, with a collision cost, collision rate."""
    n = max(row["trajectories"], 1)
    out = {"sample/success": row["successes"] / n}
    if "colliding" in row:
        out["sample/collision_rate"] = row["colliding"] / n
    return out


def print_round(row: dict[str, Any]) -> None:
    """One line per round: what it sampled and paired, the losses its update had, its evaluation and times."""
    colliding = f", {row['colliding']} colliding" if "colliding" in row else ""
    line = (f"round {row['round']}: {row['trajectories']} trajectories ({row['successes']} successes{colliding}), "
            f"{row['pairs']} pairs")
    update = row["update"] or {}
    if "tpo_loss" in update:  # absent without pairs and with --tpo.preference false
        line += f", tpo loss {update['tpo_loss']:.4f}, accuracy {update.get('accuracy', 0):.2f}"
    line += "".join(f", {k} {update[k]:.4f}" for k in ("chosen_nll", "chosen_bc", "demo_bc") if k in update)
    if row["eval"] is not None:
        ev = row["eval"]
        line += f"; eval success {ev['success']:.2f} ({ev['success_ci'][0]:.2f}-{ev['success_ci'][1]:.2f})"
    t = row.get("time", {})
    line += "; " + " ".join(f"{name} {t[key]:.0f}s" for name, key in ROUND_TIMES if key in t)
    print(line, flush=True)


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON at ``path`` atomically (tmp, fsync, rename)."""
    write_text_atomic(path, json.dumps(data, indent=2, default=float))


def write_round_dataset(root: Path, trajs: Sequence[Trajectory], spec: EnvSpec, fps: float, round_index: int) -> Path:
    """The round's trajectories as a LeRobotDataset v3 at ``root`` (one frame per decision, atomically).

    Each frame holds the decision observation, ``action`` (the chunk's first action), ``action.chunk`` (the
    whole chunk, flattened), ``next.success`` on the last frame of a successful trajectory, and
    ``grape.trajectory`` / ``grape.state`` / ``grape.score`` (the trajectory's id, initial state and score).
    """
    if root.exists():  # a finished dataset of this round (a resumed run redoes an interrupted round only)
        return root
    h, a = trajs[0].actions.shape[1:]
    extra = {
        "action.chunk": {"dtype": "float32", "shape": (h * a,), "names": None},
        "grape.trajectory": {"dtype": "int64", "shape": (1,), "names": None},
        "grape.state": {"dtype": "int64", "shape": (1,), "names": None},
        "grape.score": {"dtype": "float32", "shape": (1,), "names": None},
    }
    rec = EpisodeRecorder(root, f"local/grape-round-{round_index}", spec, max(1, round(fps)), extra_features=extra)
    for t in trajs:
        for d in range(t.decisions):
            rec.add_frame(t.obs, t.actions[d, 0], 0.0, t.success and d == t.decisions - 1, index=d,
                          **{"action.chunk": t.actions[d].reshape(-1).float().numpy(),
                             "grape.trajectory": np.array([t.id]), "grape.state": np.array([t.state]),
                             "grape.score": np.array([t.score], np.float32)})
        rec.save_episode()
    return rec.finalize()


def trajectory_video(path: Path, traj: Trajectory, image_keys: list[str], fps: float) -> Path | None:
    """An MP4 of one trajectory's decision observations (cameras side by side); None without cameras."""
    if not image_keys:
        return None
    writer = VideoWriter(path, fps)
    for d in range(traj.decisions):
        writer.add_obs({k: traj.obs[k][d : d + 1] for k in image_keys}, image_keys, max_envs=1)
    return writer.close()


def pair_videos(out_dir: Path, pairs: Sequence[PreferencePair], image_keys: list[str], fps: float) -> dict[str, str]:
    """Videos of the chosen and the rejected trajectory of the first pair (one state)."""
    if not pairs or not image_keys:
        return {}
    out_dir.mkdir(parents=True, exist_ok=True)
    p = pairs[0]
    videos = {}
    for tag, t in (("chosen", p.chosen), ("rejected", p.rejected)):
        made = trajectory_video(out_dir / f"{tag}.mp4", t, image_keys, fps)
        if made is not None:
            videos[f"{tag} (state {p.state}, score {t.score:.2f}, success {t.success})"] = str(made)
    return videos


def round_plots(rows: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """``success.png`` (success per round with its 95% interval), ``costs.png`` (each cost's mean per round) and
    ``time.png`` (each round's wall seconds stacked by :data:`ROUND_TIMES`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    evals = [r for r in rows if r.get("eval") is not None]
    if not evals:
        return []
    xs = [r["round"] for r in evals]
    written = []
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ys = [r["eval"]["success"] for r in evals]
    lo = [y - r["eval"]["success_ci"][0] for y, r in zip(ys, evals)]
    hi = [r["eval"]["success_ci"][1] - y for y, r in zip(ys, evals)]
    ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label="success (95% CI)")
    # the exploring episodes each round sampled (adaptive: a state samples until both outcomes exist)
    sampled = [r for r in rows if r.get("trajectories")]
    if sampled:
        ax.plot([r["round"] for r in sampled], [r["successes"] / r["trajectories"] for r in sampled], marker=".",
                ls=":", label="success of the sampled episodes")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("round (0 = before alignment)")
    ax.set_title("Success per round")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    written.append(_save(fig, out_dir / "success.png"))
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    for cost in evals[0]["eval"]["costs"]:
        ax.plot(xs, [r["eval"]["costs"][cost] for r in evals], marker="o", label=cost)
    if "collision_rate" in evals[0]["eval"]:
        ax.plot(xs, [r["eval"]["collision_rate"] for r in evals], marker="s", ls="--", label="collision rate")
    colliding = [r for r in sampled if "colliding" in r]
    if colliding:
        ax.plot([r["round"] for r in colliding], [r["colliding"] / r["trajectories"] for r in colliding], marker=".",
                ls=":", label="collision rate of the sampled episodes")
    ax.set_yscale("symlog", linthresh=0.01)
    ax.set_xlabel("round (0 = before alignment)")
    ax.set_title("Cost means per episode")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    written.append(_save(fig, out_dir / "costs.png"))
    timed = [{"round": r["round"], **r["time"]} for r in rows if r.get("time")]
    if timed:
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
        stack_times(ax, timed, [key for _, key in ROUND_TIMES], x="round")
        ax.set_xlabel("round")
        ax.set_title("Where each round's time goes")
        ax.legend(fontsize=7, ncol=4)
        written.append(_save(fig, out_dir / "time.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def write_align_report(run_dir: Path, summary: dict[str, Any], rows: list[dict[str, Any]], plots: list[Path],
                       videos: dict[str, str]) -> Path:
    """``report.json`` (``summary``) and ``report.md``: success per round with intervals, costs before / after,
    collision rate, mean steps of successes, plots and videos."""
    write_json(run_dir / "report.json", summary)
    b, a = summary["before"], summary["after"]
    lines = [f"# {summary['name']}", "",
             f"GRAPE alignment (`{summary['objective']}` objective) of `{summary['policy']}` on `{summary['env_id']}`, "
             f"seed {summary['seed']}, {summary['rounds']} rounds, {summary['env_steps']} env steps, "
             f"{summary['wall_seconds']:.0f} s wall-clock.", "",
             "| round | success | 95% CI | episodes | trajectories | sampled successes | sampled colliding | pairs | "
             "states without a pair |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ev = r.get("eval")
        cells = (f"{ev['success']:.3f} | {ev['success_ci'][0]:.3f}-{ev['success_ci'][1]:.3f} | {ev['episodes']}"
                 if ev else "- | - | -")
        lines.append(f"| {r['round']} | {cells} | {r.get('trajectories', '-')} | {r.get('successes', '-')} | "
                     f"{r.get('colliding', '-')} | {r.get('pairs', '-')} | {r.get('unpaired_states', '-')} |")
    lines += ["", "| measure | before | after |", "|---|---|---|"]
    lines.append(f"| success | {b['success']:.3f} | {a['success']:.3f} |")
    if "collision_rate" in b:
        lines.append(f"| collision rate (episodes) | {b['collision_rate']:.3f} | {a['collision_rate']:.3f} |")
        cb, ca = collisions_by_outcome(b), collisions_by_outcome(a)
        if cb and ca:
            for k in cb:
                lines.append(f"| colliding {k} / {k} | {cb[k][0]} / {cb[k][1]} | {ca[k][0]} / {ca[k][1]} |")
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    lines.append(f"| mean steps of successes | {fmt(b['mean_steps_success'])} | {fmt(a['mean_steps_success'])} |")
    states, sb, sa = shared_success_steps(b, a)
    if states:
        lines.append(f"| mean steps of successes, the {states} states solved before and after | {fmt(sb)} | {fmt(sa)} |")
    for cost in b["costs"]:
        lines.append(f"| cost `{cost}` (mean per episode) | {b['costs'][cost]:.4f} | {a['costs'][cost]:.4f} |")
    timed = [r["time"] for r in rows if r.get("time")]
    if timed:
        total = {label: sum(t.get(key, 0.0) for t in timed) for label, key in ROUND_TIMES}
        lines += ["", f"Where the time went over {len(timed)} rounds (wall seconds; the first evaluation and the "
                  "final report are outside the rounds):", "",
                  "| " + " | ".join(total) + " | rounds |", "|" + "---|" * (len(total) + 1),
                  "| " + " | ".join(f"{v:.0f}" for v in total.values()) + f" | {sum(total.values()):.0f} |"]
    skipped = [r["round"] for r in rows if r.get("skipped")]
    if skipped:
        lines += ["", f"Rounds without a pair (all successes or all failures per state), skipped: {skipped}."]
    return write_report_md(run_dir, lines, plots, {k: str(Path(v).relative_to(run_dir)) for k, v in videos.items()})
