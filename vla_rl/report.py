"""The run report: ``report.json`` (headline numbers), ``report.md`` and PNG plots from ``metrics.jsonl``."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vla_core.manifest import write_text_atomic
from vla_rl.run_logging import read_metrics
from vla_rl.timing import BREAKDOWN

PLOTS = {
    "success.png": ("Success rate", ["rollout/success", "eval/success"]),
    "return.png": ("Episode return", ["rollout/return", "eval/return"]),
    # PPO / GRPO's terms, and the supervised learners' (sft, filtered_bc, rac) one loss
    "losses.png": ("Losses", ["update/policy_loss", "update/value_loss", "update/entropy", "update/loss"]),
    "time.png": ("Seconds per iteration by stage", list(BREAKDOWN)),
}


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if v is not None:
            xs.append(r["step"])
            ys.append(v)
    return xs, ys


def make_plots(metrics_file: str | Path, out_dir: str | Path) -> list[Path]:
    """Write the PNG plots of :data:`PLOTS` (those with data) into ``out_dir``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_file)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for fname, (title, keys) in PLOTS.items():
        series = {k: _series(rows, k) for k in keys}
        if not any(xs for xs, _ in series.values()):
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
        if fname == "time.png":  # stacked: the stages add up to each iteration's wall time
            stack_times(ax, [r for r in rows if r.get("time/iteration_s") is not None], BREAKDOWN)
        for key, (xs, ys) in series.items() if fname != "time.png" else ():
            if xs:
                ax.plot(xs, ys, marker="o" if key.startswith("eval/") else None, markersize=3, label=key)
        if fname == "success.png":
            lo, hi = _series(rows, "eval/success_ci_low"), _series(rows, "eval/success_ci_high")
            if lo[0] and len(lo[0]) == len(hi[0]):
                ax.fill_between(lo[0], lo[1], hi[1], alpha=0.2, label="eval 95% CI")
            ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("env steps")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        tmp = out_dir / f".{fname}.tmp.png"
        fig.savefig(tmp)
        plt.close(fig)
        os.replace(tmp, out_dir / fname)
        written.append(out_dir / fname)
    return written


def stack_times(ax: Any, rows: Sequence[dict[str, Any]], keys: Sequence[str], x: str = "step") -> None:
    """A stacked area per ``time/*_s`` key of ``keys`` (the stages that add up to each row's wall time) over the
    rows' ``x``; keys no row has are left out. Training iterations stack :data:`BREAKDOWN`, ``vla-rl align``'s
    rounds :data:`vla_rl.grape.report.ROUND_TIMES`."""
    keys = [k for k in keys if any(r.get(k) for r in rows)]
    xs = [r[x] for r in rows]
    import matplotlib

    colors = matplotlib.colormaps["tab20"].colors
    ax.stackplot(xs, [[r.get(k) or 0.0 for r in rows] for k in keys], colors=colors[: len(keys)],
                 labels=[k.removeprefix("time/").removesuffix("_s") for k in keys])
    ax.set_ylabel("seconds")


def time_totals(metrics_file: str | Path) -> dict[str, float]:
    """Seconds per :data:`BREAKDOWN` stage summed over a run's iterations (empty without timings)."""
    path = Path(metrics_file)
    rows = read_metrics(path) if path.exists() else []
    totals = {k.removeprefix("time/").removesuffix("_s"): sum(r.get(k) or 0.0 for r in rows) for k in BREAKDOWN}
    return {k: v for k, v in totals.items() if v > 0}


def write_report(run_dir: str | Path, summary: dict[str, Any], plots: Sequence[Path], videos: dict[str, str]) -> Path:
    """Write ``report.json`` (``summary``) and ``report.md`` into ``run_dir``; returns the markdown path."""
    run_dir = Path(run_dir)
    write_text_atomic(run_dir / "report.json", json.dumps(summary, indent=2))
    b, a = summary.get("success_before"), summary.get("success_after")
    lines = [
        f"# {summary.get('name', run_dir.name)}",
        "",
        f"Env `{summary.get('env_id')}`, policy `{summary.get('policy')}`, algorithm `{summary.get('algorithm')}`, "
        f"seed {summary.get('seed')}, {summary.get('wall_seconds', 0):.0f} s wall-clock"
        + (f", learner on `{summary['device']}`." if summary.get("device") else "."),
        "",
        "| | success | 95% CI | episodes |",
        "|---|---|---|---|",
    ]
    if b is not None:
        lo, hi = summary["success_before_ci"]
        lines.append(f"| before RL | {b:.3f} | {lo:.3f}-{hi:.3f} | {summary['episodes_per_eval']} |")
    if a is not None:
        lo, hi = summary["success_after_ci"]
        lines.append(f"| after RL | {a:.3f} | {lo:.3f}-{hi:.3f} | {summary['episodes_per_eval']} |")
    if b is not None and a is not None:
        lines += ["", f"Gain: **{a - b:+.3f}** success rate."]
    if summary.get("sft_steps") is not None:
        sft = f"Pre-training: {summary['sft_steps']} steps on {summary.get('sft_episodes')} demos"
        if summary.get("sft_check_success") is not None:
            sft += f"; the last success check (its own episodes) read {summary['sft_check_success']:.2f}"
        lines += ["", sft + "."]
    if summary.get("per_task_after"):
        lines += ["", "| task | before | after | after 95% CI | episodes |", "|---|---|---|---|---|"]
        before_t = summary.get("per_task_before", {})
        for task, row in summary["per_task_after"].items():
            bt = before_t.get(task, {}).get("success")
            ci = f"{row['ci_low']:.2f}-{row['ci_high']:.2f}" if "ci_low" in row else "-"
            lines.append(f"| {task} | {'-' if bt is None else f'{bt:.2f}'} | {row['success']:.2f} | {ci} "
                         f"| {row.get('episodes', '-')} |")
    if summary.get("stages"):
        lines += ["", "| stage | seconds |", "|---|---|"]
        lines += [f"| {k} | {v:.0f} |" for k, v in summary["stages"].items()]
    times = time_totals(run_dir / "metrics.jsonl")
    if times:
        total = sum(times.values())
        lines += ["", f"Where the training iterations' {total:.0f} s went:", "", "| part | seconds | share |",
                  "|---|---|---|"]
        lines += [f"| {k} | {v:.1f} | {v / total:.0%} |" for k, v in times.items()]
    return write_report_md(run_dir, lines, plots, videos)


def write_report_md(run_dir: Path, lines: list[str], plots: Sequence[Path], videos: dict[str, str]) -> Path:
    """``run_dir/report.md`` (atomically): ``lines``, then the plots and the ``videos`` (paths relative to
    ``run_dir``) sections every run report ends with; returns its path."""
    lines = [*lines, "", "## Plots", ""] + [f"![{p.stem}]({p.relative_to(run_dir)})" for p in plots]
    if videos:
        lines += ["", "## Videos", ""] + [f"- {k}: `{v}`" for k, v in videos.items()]
    md = run_dir / "report.md"
    write_text_atomic(md, "\n".join(lines) + "\n")
    return md
