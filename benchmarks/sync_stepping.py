"""Free-running workers vs synchronous batch stepping: what any ``step()`` over worker processes pays.

    OMP_NUM_THREADS=1 python benchmarks/sync_stepping.py [--workers 1 2] [--steps 6000]

``benchmarks/sim_throughput.py`` compares our layer with W raw simulators that run free: each in its
own process, never waiting for the others or for a parent. A batched ``env.step(actions [B, A])``
cannot run free: every step waits for the slowest worker and then for the caller. This benchmark
puts the field's standard synchronous vectorizer beside ours on the same task, one action at a time,
one env per worker (``mujoco/pick-red``, 64x64 camera):

- ``free``: ``sim_throughput``'s raw side (W spawned processes, each stepping its ``TabletopEnv``);
- ``gymnasium``: ``gymnasium.vector.AsyncVectorEnv`` (shared memory, same-step auto-reset) over the
  same ``TabletopEnv`` behind a minimal ``gymnasium.Env`` adapter;
- ``ours``: ``sim.make_env("mujoco/pick-red", num_envs=W, num_workers=W)`` (default ``spin_wait``).

Timed blocks rotate the three sides' order every round, so all see the same load. Published by
``benchmarks/harness.py``.
"""

from __future__ import annotations

import argparse
import os
import time

import harness
import numpy as np
from sim_throughput import ACTION_SEED_OFFSET, CASES, OursSide, RawMujoco, RawSide, _set_threads

CASE = CASES["mujoco-64"]


def _gym_env(seed: int):  # a module-level factory: AsyncVectorEnv pickles it into its workers
    import gymnasium as gym

    class TabletopGym(gym.Env):
        """The raw ``TabletopEnv`` as a ``gymnasium.Env`` (observations as a Dict of the env's own arrays)."""

        def __init__(self) -> None:
            self.env = RawMujoco(CASE, seed, 0).env
            spaces = {}
            for k, s in self.env.spec.observation.items():
                dtype = np.dtype(str(s.dtype).removeprefix("torch."))
                lo, hi = (0, 255) if dtype == np.uint8 else (-np.inf, np.inf)
                spaces[k] = gym.spaces.Box(lo, hi, tuple(s.shape), dtype)
            self.observation_space = gym.spaces.Dict(spaces)
            self.action_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)

        def reset(self, *, seed: int | None = None, options: dict | None = None):
            obs, _ = self.env.reset(seed)
            return obs, {}

        def step(self, action):
            out = self.env.step(np.asarray(action, np.float32))
            return out.obs, out.reward, out.terminated, out.truncated, {}

        def close(self) -> None:
            self.env.close()

    return TabletopGym()


class GymSide:
    """``AsyncVectorEnv`` of ``workers`` ``TabletopGym`` envs, random actions (``run`` like the other sides)."""

    def __init__(self, workers: int, seed: int) -> None:
        import functools

        import gymnasium as gym

        fns = [functools.partial(_gym_env, seed + i) for i in range(workers)]
        self.env = gym.vector.AsyncVectorEnv(fns, shared_memory=True, context="forkserver",
                                             autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        self.env.reset(seed=seed)
        self.rng = np.random.default_rng(seed + ACTION_SEED_OFFSET)
        self.workers = workers

    def run(self, chunks: int, horizon: int) -> tuple[float, int]:
        resets = 0
        for _ in range(chunks * horizon):
            actions = self.rng.uniform(-1.0, 1.0, size=(self.workers, 4)).astype(np.float32)
            _, _, term, trunc, _ = self.env.step(actions)
            resets += int((term | trunc).sum())
        return 0.0, resets

    def close(self) -> None:
        self.env.close()


def measure(workers: int, steps: int, rounds: int, seed: int) -> dict[str, float]:
    """Aggregate env-steps/s of each side over ``rounds`` rotating blocks of ``steps // rounds`` env-steps."""
    per_block = max(1, steps // (rounds * workers))  # steps per env per block
    sides = {"free": RawSide(CASE, workers, 1, seed), "gymnasium": GymSide(workers, seed),
             "ours": OursSide(CASE, workers, 1, seed)}
    try:
        for side in sides.values():  # untimed warm-up
            side.run(CASE.warmup, 1)
        wall = dict.fromkeys(sides, 0.0)
        names = list(sides)
        for r in range(rounds):
            for name in names[r % 3:] + names[: r % 3]:
                t = time.perf_counter()
                sides[name].run(per_block, 1)
                wall[name] += time.perf_counter() - t
        return {name: per_block * rounds * workers / w for name, w in wall.items()}
    finally:
        for side in sides.values():
            side.close()


def markdown(results: dict[int, dict[str, float]], wall_s: float) -> str:
    rows = [
        f"| {w} | {r['free']:.1f} | {r['gymnasium']:.1f} | {r['gymnasium'] / r['free']:.2f} | {r['ours']:.1f} | "
        f"{r['ours'] / r['free']:.2f} | {r['ours'] / r['gymnasium']:.2f} |"
        for w, r in results.items()
    ]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return "\n".join([
        f"{wall_s / 60:.1f} min, load average {load:.1f} at the end: `mujoco/pick-red` (64x64 camera), "
        "W workers x 1 env, one action at a time, random actions, env-steps/s aggregated over the workers, timed "
        "blocks rotating the three sides' order. `free` = W independent processes stepping the raw task (the raw "
        "side of the table above); `gymnasium` = `gymnasium.vector.AsyncVectorEnv` (shared memory, same-step "
        "auto-reset) over the same raw task; `ours` = `sim.make_env(num_workers=W)`. A synchronous batch step "
        "waits for the slowest worker and for the caller; free-running workers never wait. "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')}.",
        "",
        "| workers | free steps/s | gymnasium steps/s | gymnasium / free | ours steps/s | ours / free | "
        "ours / gymnasium |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
    ]) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description="free-running workers vs synchronous batch stepping (gymnasium, ours)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, default=6000, help="env-steps per side per worker count")
    p.add_argument("--rounds", type=int, default=9, help="timed blocks per side (a multiple of 3 rotates evenly)")
    p.add_argument("--seed", type=int, default=0)
    args = harness.add_output_args(p).parse_args()
    _set_threads()
    t0 = time.perf_counter()
    results = {}
    for w in args.workers:
        results[w] = measure(w, args.steps, args.rounds, args.seed)
        print(w, {k: round(v, 1) for k, v in results[w].items()}, flush=True)
    text = markdown(results, time.perf_counter() - t0)
    print(text)
    harness.publish("sync_stepping", args, text, rows=[{"workers": w, **r} for w, r in results.items()])


if __name__ == "__main__":
    main()
