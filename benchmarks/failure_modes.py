"""Where a policy's failures on ``mujoco/pick-any`` come from, read off the tabletop's privileged signals.

    OMP_NUM_THREADS=1 python benchmarks/failure_modes.py --policy LABEL=POLICY_DIR [...] [--episodes 400]
        [--num_steps N]

Each policy plays its deterministic action (the deployed ODE from zero noise) on held-out episodes (seeds of their
own, away from training and from the runs' evaluations). Per episode the env's signals (never observed by the
policy; ``sim/mujoco_tasks/env.py``) give the pinch point's closest approach to the target cube and to the nearest
other cube, the furthest task stage reached (reach, grasp, lift) and which cube the gripper came near first. A
failed episode is then

- ``wrong cube``: the gripper came within ``NEAR`` of another cube before the target (and maybe reached the target
  later), or it stayed closer to another cube than to the target all episode without reaching either: the
  target was not selected;
- ``stalled``: it never came within ``NEAR`` of any cube while its closest approach was nearer the target;
- ``grasp``: it reached the target and failed to close on it (furthest stage ``reach``);
- ``lift``: it grasped and did not lift it high enough, or dropped it.

Each episode is also split by its layout: whether the target was the cube nearest the gripper (in the table's
plane) in the episode's first observation. A policy that reads the instruction weakly goes for the nearest cube, so its
success is high when the nearest cube is the target and low when it is not (columns ``nearest`` / ``not``).

Published by ``benchmarks/harness.py`` (``benchmarks/results/failure_modes.json`` and its block of ``docs/results.md``).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import time
from pathlib import Path
from typing import Any

import harness
import numpy as np
import torch

from policies.base import ActMode
from policies.loading import load_policy
from sim.mujoco_tasks.privileged import observed_state
from vla_rl.config import EnvConfig
from vla_rl.evaluation import wilson_interval

NEAR = 0.04  # m: the gripper "came near" a cube (the reach stage holds at 0.03)
SEED = 2_000_000_000  # held-out episodes of their own
CLASSES = ("wrong cube", "stalled", "grasp", "lift")


def classify(ep: dict[str, Any]) -> str:
    """The failure class of one failed episode (module doc)."""
    if ep["first"] == "other" or (ep["first"] is None and ep["other_min"] < ep["target_min"]):
        return "wrong cube"
    if ep["first"] is None or ep["stage"] == 0:
        return "stalled"
    return "grasp" if ep["stage"] == 1 else "lift"


def target_nearest(state: torch.Tensor, env_state: torch.Tensor) -> bool:
    """Whether the task's cube is the cube nearest the pinch point in the table's plane (tabletop observations)."""
    task, snapshot, _ = observed_state(state.numpy(), env_state.numpy())
    d = np.linalg.norm(snapshot.cubes[:, :2] - snapshot.pinch[None, :2], axis=-1)
    return bool(d[task.cube] <= d.min())


def play(policy_dir: str, episodes: int, seed: int, num_envs: int, num_steps: int) -> list[dict[str, Any]]:
    """``episodes`` held-out episodes of the policy's deterministic action, each summarized from the signals."""
    policy = load_policy(policy_dir).eval()
    if num_steps:
        policy.configure_sampler(dataclasses.replace(policy.sampler, num_steps=num_steps))
    env_cfg = EnvConfig(id="mujoco/pick-any", num_envs=num_envs, obs_mode="rgb", wrist_camera=True)
    fresh = {"stage": 0, "target_min": np.inf, "other_min": np.inf, "first": None, "nearest": None}
    cur = [dict(fresh) for _ in range(num_envs)]
    done: list[dict[str, Any]] = []
    torch.manual_seed(seed)
    with env_cfg.make(num_envs=num_envs, seed=seed) as env:
        obs = env.reset(seed=seed)
        while len(done) < episodes:
            for i in range(num_envs):  # the layout of each episode's first observation (privileged, never acted on)
                if cur[i]["nearest"] is None:
                    cur[i]["nearest"] = target_nearest(obs["observation.state"][i], obs["observation.env_state"][i])
            with torch.no_grad():
                chunk = policy.act(obs, ActMode.EVAL).actions
            out = env.step_chunk(chunk)
            obs = out.obs
            sig = {k: v.numpy() for k, v in out.signals.items()}
            ee = np.stack([sig["ee_x"], sig["ee_y"], sig["ee_z"]], -1)  # [H, B, 3]
            target = np.stack([sig["target_x"], sig["target_y"], sig["target_z"]], -1)
            to_target = np.linalg.norm(ee - target, axis=-1)
            others = [np.linalg.norm(ee - np.stack([sig[f"obstacle{k}_{a}"] for a in "xyz"], -1), axis=-1)
                      for k in range(2)]
            count = sig["obstacle_count"]
            to_other = np.where(count > 1, np.minimum(*others), np.where(count > 0, others[0], np.inf))
            ended = (out.terminated | out.truncated).numpy()
            for h in range(chunk.shape[1]):
                for i in range(num_envs):
                    ep = cur[i]
                    ep["stage"] = max(ep["stage"], int(sig["stage_progress"][h, i]))
                    ep["target_min"] = min(ep["target_min"], float(to_target[h, i]))
                    ep["other_min"] = min(ep["other_min"], float(to_other[h, i]))
                    if ep["first"] is None and min(to_target[h, i], to_other[h, i]) < NEAR:
                        ep["first"] = "target" if to_target[h, i] <= to_other[h, i] else "other"
                    if ended[h, i]:
                        done.append({**ep, "success": bool(out.success[h, i])})
                        cur[i] = dict(fresh)
    return done[:episodes]


def summarize(label: str, policy_dir: str, eps: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    fails = [e for e in eps if not e["success"]]
    counts = collections.Counter(classify(e) for e in fails)
    wins = sum(e["success"] for e in eps)
    lo, hi = wilson_interval(wins, len(eps))
    split = {}
    for name, flag in (("nearest", True), ("not", False)):
        part = [e for e in eps if e["nearest"] is flag]
        split[name] = {"episodes": len(part), "success": sum(e["success"] for e in part) / max(1, len(part))}
    return {"layout": split, "label": label, "policy": policy_dir, "episodes": len(eps), "success": wins / len(eps),
            "ci": [lo, hi], "failures": len(fails), "classes": {c: counts.get(c, 0) for c in CLASSES},
            "wrong_cube_share": counts.get("wrong cube", 0) / max(1, len(fails)), "wall_s": wall,
            "stalled_target_min_m": sorted(round(e["target_min"], 3) for e in fails if classify(e) == "stalled")}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| policy | episodes | success [95% CI] | failures | " + " | ".join(CLASSES)
             + " | wrong cube share | success, target nearest | success, target not nearest |",
             "|---|---:|---|---:|" + "---:|" * len(CLASSES) + "---:|---:|---:|"]
    for r in rows:
        lo, hi = r["ci"]
        lines.append(f"| {r['label']} | {r['episodes']} | {r['success']:.3f} [{lo:.2f}-{hi:.2f}] | {r['failures']} | "
                     + " | ".join(str(r["classes"][c]) for c in CLASSES) + f" | {r['wrong_cube_share']:.2f} | "
                     + " | ".join(_split(r, k) for k in ("nearest", "not")) + " |")
    return "\n".join(lines)


def _split(row: dict[str, Any], key: str) -> str:
    part = row["layout"][key]
    return f"{part['success']:.3f} ({part['episodes']})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", nargs="+", required=True, help="LABEL=POLICY_DIR (a saved policy folder)")
    ap.add_argument("--episodes", type=int, default=400)
    ap.add_argument("--num_envs", type=int, default=16)
    ap.add_argument("--num_steps", type=int, default=0, help="denoising steps (0: the policy's own)")
    ap.add_argument("--seed", type=int, default=SEED)
    args = harness.add_output_args(ap).parse_args()
    torch.set_num_threads(1)
    rows = []
    for spec in args.policy:
        label, sep, path = spec.partition("=")
        if not sep or not Path(path).is_dir():
            raise SystemExit(f"failure_modes: --policy {spec!r}: expected LABEL=POLICY_DIR with an existing folder")
        t = time.perf_counter()
        eps = play(path, args.episodes, args.seed, args.num_envs, args.num_steps)
        rows.append(summarize(label, path, eps, time.perf_counter() - t))
        print(table(rows[-1:]), flush=True)
    text = (f"Each policy's deterministic action on {args.episodes} held-out episodes of their own (seed {args.seed}), "
            "failures classified from the env's privileged signals (the script's doc: `wrong cube` = the gripper went "
            "to, or stayed nearer, a non-target cube; `stalled` = it came near no cube; `grasp` / `lift` = the stage "
            f"it failed at).\n\n{table(rows)}")
    print(table(rows))
    harness.publish("failure_modes", args, text, rows=rows,
                    summary={"seed": args.seed, "num_steps": args.num_steps, "near_m": NEAR})


if __name__ == "__main__":
    main()
