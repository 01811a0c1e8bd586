"""Env steps/s of a LIBERO suite env (``libero/libero_spatial``) vs the single-task env, 2 workers each.

What the multi-task layer (:mod:`sim.backends.libero_suite`: per-slot task schedule, per-task env cache,
``env_state`` padding, ``task_index``) costs on the same machine. Three sides, all
``make_env(num_envs=2, num_workers=2)``, rendered (two cameras), stepped in chunks of ``--chunk`` random
actions (``env.step_chunk``, as training does), paying their own auto-resets:

- ``single``: ``libero/libero_spatial/0``, the single-task env (init state from the seed);
- ``suite``: ``libero/libero_spatial`` with all weight on task 0 (``schedule_tasks``): the same scene, no
  switching, so the difference to ``single`` is the layer itself;
- ``suite-switch``: ``libero/libero_spatial`` drawing uniformly over its first ``--switch-tasks`` (3) tasks
  at every reset, with ``task_cache`` equal to that (each scene built once per slot during warm-up, kept
  after): task switching without scene builds. A switch to a task outside the cache builds its scene
  (~1-3 s on an idle machine); every extra cached rendered scene held ~1 GB per worker here (a worker
  caching all 10 was OOM-killed on the shared 24 GiB machine), so the full-suite cost is memory, not the switch.

Episodes are cut at ``--max-steps`` (all sides) so a run sees many resets. Timed blocks rotate the side
order every repeat (the machine is shared: medians over repeats, each side with the same load pattern).
CPU ms per env-step (this process and the workers) is reported as the less load-sensitive cost.

Run::

    python benchmarks/suites.py                       # published by benchmarks/harness.py
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path
from typing import Any

import harness
import numpy as np
import torch
from sim_throughput import _proc_cpu, _set_threads

from sim.tasks import Assignment

SIDES = ("single", "suite", "suite-switch")


class Side:
    """One env of the comparison, with random chunks from a fixed seed."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        from sim import make_env

        self.name = name
        env_id = "libero/libero_spatial/0" if name == "single" else "libero/libero_spatial"
        options: dict[str, Any] = {"obs_mode": "rgb", "image_size": args.image_size, "max_episode_steps": args.max_steps}
        if name == "suite-switch":
            options["task_cache"] = args.switch_tasks
        before = {p.pid for p in mp.active_children()}
        self.env = make_env(env_id, num_envs=args.envs, seed=args.seed, num_workers=args.workers, **options)
        self.pids = sorted({p.pid for p in mp.active_children()} - before)
        if name != "single":
            weights = np.zeros(len(self.env.spec.tasks))
            weights[: 1 if name == "suite" else args.switch_tasks] = 1.0
            self.env.schedule_tasks(weights=weights)
        self.rng = np.random.default_rng(args.seed + 1)
        self.tasks: set[int] = set()
        self.env.reset()

    def cpu(self) -> float:
        return time.process_time() + sum(_proc_cpu(p) for p in self.pids)

    def run(self, chunks: int, horizon: int) -> tuple[float, float, int, int]:
        """``chunks`` random chunks; returns (wall s, CPU s, env-steps, resets)."""
        env, n = self.env, self.env.num_envs
        cpu, t0, resets = self.cpu(), time.perf_counter(), 0
        for _ in range(chunks):
            actions = torch.from_numpy(self.rng.uniform(-1, 1, (n, horizon, env.spec.action_dim)).astype(np.float32))
            out = env.step_chunk(actions)
            resets += int((out.terminated | out.truncated).sum())
            if "task_index" in out.obs:
                self.tasks |= set(out.obs["task_index"].tolist())
        return time.perf_counter() - t0, self.cpu() - cpu, chunks * horizon * n, resets


def _rss_gb(pid: int) -> float:
    """Resident memory of process ``pid`` in GB (0 if unreadable)."""
    try:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0.0
    return int(line.split()[1]) / 1e6


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Build the sides, warm them up (untimed), then ``--repeats`` rotated rounds of timed blocks."""
    t_build = time.perf_counter()
    sides = {name: Side(name, args) for name in SIDES}
    build_s = time.perf_counter() - t_build
    print(f"built {len(sides)} sides in {build_s:.0f} s; warming up", flush=True)
    switch = sides["suite-switch"].env  # build every task's scene in both slots before timing
    switch.schedule_tasks(plans={i: [Assignment(t) for t in range(args.switch_tasks)] for i in range(switch.num_envs)})
    for _ in range(args.switch_tasks):
        switch.reset()
    for side in sides.values():
        side.run(args.warmup, args.chunk)
    blocks: dict[str, list[dict[str, float]]] = {name: [] for name in SIDES}
    for r in range(args.repeats):
        order = SIDES[r % 3:] + SIDES[: r % 3]
        for name in order:
            wall, cpu, steps, resets = sides[name].run(args.chunks, args.chunk)
            blocks[name].append({"wall_s": wall, "cpu_s": cpu, "steps": steps, "resets": resets, "sps": steps / wall})
        print(f"repeat {r + 1}/{args.repeats}: " + ", ".join(f"{n} {blocks[n][-1]['sps']:.1f}" for n in SIDES), flush=True)
    tasks = sorted(sides["suite-switch"].tasks)
    rss = {name: sum(_rss_gb(p) for p in side.pids) for name, side in sides.items()}
    for side in sides.values():
        side.env.close()
    out: dict[str, Any] = {"build_s": build_s, "suite_switch_tasks": tasks, "sides": {}}
    for name in SIDES:
        rows = blocks[name]
        out["sides"][name] = {
            "median_sps": statistics.median(b["sps"] for b in rows),
            "cpu_ms_per_step": 1e3 * sum(b["cpu_s"] for b in rows) / sum(b["steps"] for b in rows),
            "resets": sum(b["resets"] for b in rows), "workers_rss_gb": rss[name], "blocks": rows,
        }
    for name in ("suite", "suite-switch"):  # per repeat, each against the single-task block of the same round
        ratios = [s["sps"] / b["sps"] for s, b in zip(blocks[name], blocks["single"])]
        out["sides"][name]["ratio_vs_single"] = {"median": statistics.median(ratios), "min": min(ratios),
                                                  "max": max(ratios)}
    return out


def markdown(res: dict[str, Any], args: argparse.Namespace, wall_s: float, load: str) -> str:
    s = res["sides"]
    lines = [
        "How much the LIBERO suite layer (`libero/<suite>`: per-slot task schedule, per-task scene cache, padded "
        "`env_state`, `task_index`) costs against the single-task env. All sides: "
        f"`make_env(num_envs={args.envs}, num_workers={args.workers})`, rgb {args.image_size}x{args.image_size} "
        f"(two cameras), `step_chunk` with chunks of {args.chunk} uniformly random actions, episodes cut at "
        f"{args.max_steps} steps (auto-resets paid: LIBERO's soft reset, init state, 10 settle steps). `single` = "
        "`libero/libero_spatial/0`; `suite` = `libero/libero_spatial` with all task weight on task 0 (same scene, "
        f"no switching); `suite-switch` = uniform over tasks 0-{args.switch_tasks - 1} at every reset, `task_cache "
        f"{args.switch_tasks}`, each scene built during the untimed warm-up (tasks played in timed blocks: "
        f"{res['suite_switch_tasks']}). "
        f"{args.repeats} rounds of {args.chunks} chunks per side, side order rotated every round; steps/s = median "
        "over rounds; ratio = per round against that round's `single` block, median [min-max]; CPU ms/step = "
        "user + system time of this process and its workers per env-step (less sensitive to load); RSS = the "
        "workers' resident memory at the end.",
        "",
        f"{wall_s / 60:.1f} min, load average {load} at the end, CPUs shared with other jobs, OMP_NUM_THREADS=1: "
        "absolute numbers are noisy.",
        "",
        "| side | steps/s (median) | ratio vs single | CPU ms/step | resets | workers' RSS GB |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for name in SIDES:
        r = s[name].get("ratio_vs_single")
        ratio = f"{r['median']:.3f} [{r['min']:.2f}-{r['max']:.2f}]" if r else "1"
        lines.append(f"| {name} | {s[name]['median_sps']:.1f} | {ratio} | {s[name]['cpu_ms_per_step']:.1f} | "
                     f"{s[name]['resets']} | {s[name]['workers_rss_gb']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description="LIBERO suite env vs single-task env steps/s (2 workers)")
    p.add_argument("--envs", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--chunk", type=int, default=5, help="steps per step_chunk (the presets' exec_steps)")
    p.add_argument("--chunks", type=int, default=8, help="chunks per timed block")
    p.add_argument("--max-steps", type=int, default=20, help="episode limit (short: many resets and switches)")
    p.add_argument("--warmup", type=int, default=8, help="untimed chunks per side after the scenes are built")
    p.add_argument("--repeats", type=int, default=6, help="rounds (a multiple of 3 rotates the order evenly)")
    p.add_argument("--switch-tasks", type=int, default=3, help="suite-switch: tasks drawn from (all cached)")
    p.add_argument("--seed", type=int, default=0)
    args = harness.add_output_args(p).parse_args()
    _set_threads()
    t0 = time.perf_counter()
    res = measure(args)
    wall = time.perf_counter() - t0
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    res.update(wall_s=wall, load_average=load)
    text = markdown(res, args, wall, load)
    print(text)
    harness.publish("suites", args, text, summary=res)


if __name__ == "__main__":
    main()
