"""Steps per second of our env layer (``sim.make_env``) against the raw simulator, side by side.

For each case and worker count the benchmark builds BOTH sides, warms them up
(warm-up steps are not timed), then alternates timed blocks (raw, ours, ours,
raw, ...) so both see the same machine load, and reports aggregate env-steps
per second and the ratio ours / raw.

Sides:

- ``raw``: the simulator stepped directly, no pipes in the loop:
  ``gymnasium.make(task, **gym_make_kwargs(options))`` for ManiSkill;
  LIBERO's ``OffScreenRenderEnv`` built with the arguments
  :class:`sim.backends.libero.LiberoEnv` uses; :class:`TabletopEnv` for
  ``mujoco/*``. ``W`` workers with ``N`` envs per worker
  (``--envs-per-worker N``, default 1) = ``W`` independent spawned processes
  each stepping ``N`` independent envs one after another (each chunk runs on
  env 1, then env 2, ..., as our workers do; aggregate steps/s); ``W = 0``
  steps ``N`` envs in this process.
- ``ours``: ``make_env(env_id, num_envs=N * max(W, 1), num_workers=W)``
  (each worker holds ``N`` envs, as in training runs, where a worker's fixed
  per-message cost is shared by all its envs).

Both sides take uniformly random actions in the action box from fixed seeds
(ours draws the batch's actions from one stream, each raw env from its own:
the same actions only with one env) and pay their own resets: the raw loops reset on ``terminated | truncated``
(ManiSkill: its ``TimeLimit``; LIBERO and MuJoCo: the suite / task step
limit and success), the way LIBERO's evaluation resets for LIBERO (``reset``,
``set_init_state``, 10 no-op settle steps, rendered).

Modes, each timed on the same two sides (blocks of all modes interleaved):

- ``step``: ours calls ``env.step`` once per batch step; raw steps once. Both
  build the full observation (rendered, in ``rgb``) every step.
- ``chunk H`` (``--chunk H``, default 4; 0 or 1: ``step`` only): ours calls
  ``env.step_chunk`` on ``[num_envs, H, A]`` chunks of random actions (with
  workers: one message per worker per chunk); raw steps ``H`` times per chunk
  and reads only the last observation. On MuJoCo both sides render once per
  chunk (``TabletopEnv.step_unrendered`` for the first ``H - 1`` steps, which
  still renders where an episode ends, ``step`` for the last); ManiSkill and
  LIBERO build the full observation every step on both sides. An env whose episode ends inside a
  chunk is reset at once and held still (zero actions) for the rest of the
  chunk on both sides. Every executed step counts, held-still ones included.

Observations: for ManiSkill ``state`` the raw env is made with ManiSkill's
own ``obs_mode="state"`` (the flat state vector ManiSkill returns: robot
qpos/qvel, TCP pose, object and goal poses, ``is_grasped``), while ours runs
ManiSkill with ``obs_mode="none"`` and reads its own proprioception and
privileged state (reusing ``is_grasped`` from ManiSkill's step info): both
sides produce a state observation every step. Raw loops never cross a pipe,
while ours with workers pays one synchronous round trip per batch step in
``step`` mode (one byte each way; actions, observations and scalars live in
shared memory) and one per chunk in ``chunk H`` mode.
Besides wall-clock steps/s the table reports CPU ms per env-step of every
process on each side, which is far less sensitive to other jobs' load.

Run (``source scripts/env.sh`` first)::

    python benchmarks/sim_throughput.py --quick     # small budgets; env start-up dominates (see below)
    python benchmarks/sim_throughput.py             # full, ~15 min
    python benchmarks/sim_throughput.py --cases mujoco-64 --workers 0 1 2 --steps 3000 --chunk 8

Published by ``benchmarks/harness.py``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import harness
import numpy as np
import torch

REPO = harness.ROOT
ACTION_SEED_OFFSET = 1000


@dataclass(frozen=True)
class Case:
    """One benchmark case.

    Attributes:
        name: the ``--cases`` name.
        env_id: our env id.
        options: ``make_env`` options (also used to build the raw env).
        raw: key of :data:`RAW_LOOPS`.
        steps: default env-steps per side (full run).
        quick_steps: env-steps per side with ``--quick``.
        warmup: untimed steps per env before timing, each side and mode.
    """

    name: str
    env_id: str
    options: dict[str, Any]
    raw: str
    steps: int
    quick_steps: int
    warmup: int
    note: str = field(default="")


CASES: dict[str, Case] = {
    c.name: c
    for c in (
        Case("maniskill-state", "maniskill/PickCube-v1", {"obs_mode": "state", "sim_backend": "cpu"}, "maniskill",
             1200, 200, 20),
        Case("maniskill-rgb", "maniskill/PickCube-v1", {"obs_mode": "rgb", "sim_backend": "cpu"}, "maniskill",
             240, 48, 5, "128x128 base_camera"),
        Case("libero-object", "libero/libero_object/0", {"obs_mode": "rgb"}, "libero", 160, 32, 3,
             "128x128, two cameras"),
        Case("mujoco-64", "mujoco/pick-red", {"obs_mode": "rgb", "image_size": 64}, "mujoco", 3000, 1200, 20,
             "64x64 front camera"),
        Case("mujoco-128", "mujoco/pick-red", {"obs_mode": "rgb", "image_size": 128}, "mujoco", 3000, 1200, 20,
             "128x128 front camera"),
    )
}


def _set_threads() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)


# ------------------------------------------------------------------ raw loops


class RawLoop:
    """A raw simulator stepped with random actions in chunks, resetting when an episode ends.

    Subclasses set the action box (``low``, ``high``: arrays of the action shape) and ``rng``, and
    implement :meth:`step` and :meth:`reset`; :meth:`run_chunk` (and :func:`run_loops` over several
    envs) is the loop every raw simulator shares.
    """

    low: np.ndarray
    high: np.ndarray
    rng: np.random.Generator

    def step(self, action: np.ndarray, render: bool) -> bool:
        """Apply ``action``; returns whether the episode ended. ``render=False``: nobody reads the observation."""
        raise NotImplementedError

    def reset(self) -> None:
        """Start the next episode."""
        raise NotImplementedError

    def run_chunk(self, horizon: int) -> int:
        """Execute one chunk of ``horizon`` uniformly random actions; returns the number of resets.

        Like :func:`sim.vector.run_chunk`: only the last step of a chunk has its observation read
        (``render=True``), and after an episode ends (reset at once) the env is held still (zero
        actions) for the rest of the chunk. ``horizon=1`` is plain per-step stepping.
        """
        resets = 0
        actions = self.rng.uniform(self.low, self.high, size=(horizon, *self.low.shape)).astype(np.float32)
        for h in range(horizon):
            if self.step(actions[h], render=h == horizon - 1):
                self.reset()
                resets += 1
                actions[h + 1 :] = 0.0
        return resets

    def close(self) -> None:
        pass


class RawManiSkill(RawLoop):
    """``gymnasium.make(task, sim_backend="physx_cpu", num_envs=1, **gym_make_kwargs(options))``, as the backend.

    For ``obs_mode="state"`` the raw env is made with ManiSkill's own ``obs_mode="state"`` (our backend
    passes ``"none"`` and reads its observation itself), so both sides produce a state observation
    every step: the like-for-like comparison a user of raw ManiSkill would make. ManiSkill renders
    every step (``render`` is ignored), as our backend does.
    """

    def __init__(self, case: Case, seed: int, action_seed: int) -> None:
        import gymnasium as gym
        import mani_skill.envs  # noqa: F401  registers the tasks

        from sim.backends.maniskill_common import ManiSkillOptions, gym_make_kwargs

        task = case.env_id.partition("/")[2]
        opts = ManiSkillOptions(**case.options)
        kwargs = gym_make_kwargs(opts)
        if opts.obs_mode == "state":
            kwargs["obs_mode"] = "state"
        self.env = gym.make(task, sim_backend="physx_cpu", num_envs=1, **kwargs)
        self.env.reset(seed=seed)
        space = self.env.unwrapped.single_action_space
        self.low, self.high = space.low, space.high
        self.rng = np.random.default_rng(action_seed)

    def step(self, action: np.ndarray, render: bool) -> bool:
        _, _, terminated, truncated, _ = self.env.step(action)
        return bool(terminated.any()) or bool(truncated.any())

    def reset(self) -> None:
        self.env.reset()

    def close(self) -> None:
        self.env.close()


class RawLibero(RawLoop):
    """LIBERO's ``OffScreenRenderEnv`` with :class:`sim.backends.libero.LiberoEnv`'s arguments, eval-style resets.

    Renders both cameras every step (``render`` is ignored), as our backend does.
    """

    def __init__(self, case: Case, seed: int, action_seed: int) -> None:
        import contextlib
        import io

        from sim.backends import libero as lb

        suite, _, index = case.env_id.partition("/")[2].partition("/")
        opts = lb.LiberoOptions(**case.options)
        config_dir = lb.resolve_config_dir(opts.config_path)
        config = lb.read_config(case.env_id, config_dir)
        lb._import_libero(case.env_id, config_dir, config["assets"])  # offline assets, as the backend does
        from libero.libero import benchmark
        from libero.libero.envs.env_wrapper import OffScreenRenderEnv

        with contextlib.redirect_stdout(io.StringIO()):
            bench = benchmark.get_benchmark(suite)()
        task = bench.get_task(int(index))
        self.init_states = np.asarray(bench.get_task_init_states(int(index)))
        size = opts.image_size or lb.DEFAULT_IMAGE_SIZE
        self.env = OffScreenRenderEnv(
            bddl_file_name=str(Path(config["bddl_files"]) / suite / task.bddl_file),
            hard_reset=opts.hard_reset,
            ignore_done=True,
            control_freq=int(lb.CONTROL_FREQ),
            camera_names=list(lb.CAMERAS.values()),
            camera_heights=size,
            camera_widths=size,
        )
        self.max_steps = opts.max_episode_steps or lb.SUITE_MAX_STEPS[suite]
        self.settle = opts.settle_steps
        self.next_state = seed
        self.low, self.high = np.full(7, -1.0), np.full(7, 1.0)
        self.rng = np.random.default_rng(action_seed)
        self.reset()

    def reset(self) -> None:
        self.env.reset()
        self.env.set_init_state(self.init_states[self.next_state % len(self.init_states)])
        self.next_state += 1
        for _ in range(self.settle):
            self.env.step(np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float64))
        self.t = 0

    def step(self, action: np.ndarray, render: bool) -> bool:
        self.env.step(action.astype(np.float64))
        self.t += 1
        return bool(self.env.check_success()) or self.t >= self.max_steps

    def close(self) -> None:
        self.env.close()


class RawMujoco(RawLoop):
    """:class:`sim.mujoco_tasks.env.TabletopEnv` with the config :class:`MujocoBackend` builds, no vector layer.

    Steps whose observation nobody reads use :meth:`TabletopEnv.step_unrendered`, as our layer does
    inside a chunk (the cameras are rendered anyway where an episode ends).
    """

    def __init__(self, case: Case, seed: int, action_seed: int) -> None:
        from sim.backends.mujoco import MujocoOptions
        from sim.mujoco_tasks.env import TabletopConfig, TabletopEnv

        o = MujocoOptions(**case.options)
        cfg = TabletopConfig(
            env_id=case.env_id,
            task=case.env_id.partition("/")[2],
            multi_tasks=tuple(o.multi_tasks),
            obs_mode=o.obs_mode,
            image_size=o.image_size or 64,
            wrist_camera=o.wrist_camera,
            max_episode_steps=o.max_episode_steps,
            control_freq=o.control_freq,
            max_step=o.max_step,
            reward_mode=o.reward_mode,
            terminate_on_success=o.terminate_on_success,
        )
        self.env = TabletopEnv(cfg)
        self.env.reset(seed)
        self.low, self.high = np.full(4, -1.0), np.full(4, 1.0)
        self.rng = np.random.default_rng(action_seed)

    def step(self, action: np.ndarray, render: bool) -> bool:
        out = self.env.step(action) if render else self.env.step_unrendered(action)
        return out.terminated or out.truncated

    def reset(self) -> None:
        self.env.reset(None)

    def close(self) -> None:
        self.env.close()


RAW_LOOPS: dict[str, Callable[[Case, int, int], RawLoop]] = {
    "maniskill": RawManiSkill,
    "libero": RawLibero,
    "mujoco": RawMujoco,
}


def make_loops(case: Case, first_seed: int, n: int) -> list[RawLoop]:
    """``n`` raw envs seeded ``first_seed, first_seed + 1, ...`` (the seeds ``make_env`` gives those env ids)."""
    loops: list[RawLoop] = []
    try:
        for k in range(n):
            loops.append(RAW_LOOPS[case.raw](case, first_seed + k, first_seed + k + ACTION_SEED_OFFSET))
    except BaseException:
        close_loops(loops)
        raise
    return loops


def run_loops(loops: Sequence[RawLoop], chunks: int, horizon: int) -> tuple[float, int]:
    """``chunks`` chunks on every env, env after env within a chunk (as a worker of ours runs its envs).

    Returns (CPU seconds of this process, resets).
    """
    cpu = time.process_time()
    resets = sum(loop.run_chunk(horizon) for _ in range(chunks) for loop in loops)
    return time.process_time() - cpu, resets


def close_loops(loops: Sequence[RawLoop]) -> None:
    for loop in loops:
        loop.close()


def _raw_worker(conn: Any, case_name: str, first_seed: int, n_envs: int) -> None:
    """Spawned process: build ``n_envs`` raw envs, then run ``(chunks, horizon)`` blocks on request."""
    _set_threads()
    loops: list[RawLoop] = []
    try:
        loops = make_loops(CASES[case_name], first_seed, n_envs)
        conn.send(("ok", None))
        while True:
            cmd, (chunks, horizon) = conn.recv()
            if cmd == "run":
                conn.send(("ok", run_loops(loops, chunks, horizon)))
            else:
                break
    except (KeyboardInterrupt, EOFError):
        pass
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        close_loops(loops)


class RawSide:
    """``workers`` spawned processes with ``envs_per_worker`` raw envs each (``workers == 0``: the envs run here)."""

    def __init__(self, case: Case, workers: int, envs_per_worker: int, seed: int) -> None:
        self.workers = workers
        self.conns: list[Any] = []
        self.procs: list[Any] = []
        self.local: list[RawLoop] = []
        if workers == 0:
            self.local = make_loops(case, seed, envs_per_worker)
            return
        ctx = mp.get_context("spawn")
        for i in range(workers):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_raw_worker, args=(child, case.name, seed + i * envs_per_worker, envs_per_worker),
                            daemon=True)
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        for c in self.conns:
            self._recv(c)

    @staticmethod
    def _recv(conn: Any) -> Any:
        status, payload = conn.recv()
        if status == "error":
            raise RuntimeError(f"raw worker failed:\n{payload}")
        return payload

    def run(self, chunks: int, horizon: int) -> tuple[float, int]:
        """:func:`run_loops` on every worker's envs (the workers in parallel); returns (CPU seconds, resets)."""
        if not self.conns:
            return run_loops(self.local, chunks, horizon)
        for c in self.conns:
            c.send(("run", (chunks, horizon)))
        replies = [self._recv(c) for c in self.conns]
        return sum(c for c, _ in replies), sum(r for _, r in replies)

    def close(self) -> None:
        close_loops(self.local)
        for c in self.conns:
            try:
                c.send(("close", (0, 0)))
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


# ------------------------------------------------------------------ our side


def _proc_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``, clock-tick resolution; 0 if unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class OursSide:
    """``make_env(env_id, num_envs=envs_per_worker * max(workers, 1), num_workers=workers)``, random actions."""

    def __init__(self, case: Case, workers: int, envs_per_worker: int, seed: int) -> None:
        from sim import make_env

        self.num_envs = envs_per_worker * max(workers, 1)
        before = {p.pid for p in mp.active_children()}
        self.env = make_env(case.env_id, num_envs=self.num_envs, seed=seed, num_workers=workers, **case.options)
        spec = self.env.spec.action
        self.low = -1.0 if spec.low is None else spec.low
        self.high = 1.0 if spec.high is None else spec.high
        self.action_shape = tuple(spec.shape)
        self.worker_pids = sorted({p.pid for p in mp.active_children()} - before)
        self.rng = np.random.default_rng(seed + ACTION_SEED_OFFSET)
        self.env.reset()

    def _cpu(self) -> float:
        return time.process_time() + sum(_proc_cpu(pid) for pid in self.worker_pids)

    def run(self, chunks: int, horizon: int) -> tuple[float, int]:
        """``chunks`` random chunks of ``horizon`` steps: ``env.step_chunk``, or ``env.step`` when ``horizon == 1``.

        Returns (CPU seconds of this process and our workers, resets).
        """
        env, rng = self.env, self.rng
        cpu, resets = self._cpu(), 0
        for _ in range(chunks):
            size = (self.num_envs, horizon, *self.action_shape)
            actions = torch.from_numpy(rng.uniform(self.low, self.high, size=size).astype(np.float32))
            if horizon == 1:
                _, _, terminated, truncated, _ = env.step(actions[:, 0])
            else:
                out = env.step_chunk(actions)
                terminated, truncated = out.terminated, out.truncated
            resets += int((terminated | truncated).sum())
        return self._cpu() - cpu, resets

    def close(self) -> None:
        self.env.close()


# ------------------------------------------------------------------ measurement


@dataclass
class Result:
    """Interleaved measurement of one (case, workers, mode)."""

    case: str
    workers: int
    envs_per_worker: int
    horizon: int  # steps per chunk; 1 = per-step mode
    steps: int  # env-steps per side
    raw_s: float
    ours_s: float
    raw_cpu: float
    ours_cpu: float
    block_ratios: list[float]
    raw_resets: int
    ours_resets: int
    setup_s: float

    @property
    def mode(self) -> str:
        """``step`` (per-step ``env.step``) or ``chunk H`` (``env.step_chunk`` on ``H``-step chunks)."""
        return "step" if self.horizon == 1 else f"chunk {self.horizon}"

    @property
    def raw_sps(self) -> float:
        return self.steps / self.raw_s

    @property
    def ours_sps(self) -> float:
        return self.steps / self.ours_s

    @property
    def ratio(self) -> float:
        return self.ours_sps / self.raw_sps

    @property
    def median_block_ratio(self) -> float:
        return float(np.median(self.block_ratios))


def measure(case: Case, workers: int, envs_per_worker: int, steps: int, rounds: int, seed: int,
            horizons: list[int]) -> list[Result]:
    """Build both sides once, warm every mode up, then time ``rounds`` interleaved blocks per side and mode.

    ``horizons``: the modes, steps per chunk (1 = per-step). Each round times every mode in turn,
    raw and ours in alternating order (ABBA); a block is ``steps // (rounds * envs * H)`` chunks per env
    (``envs`` = all envs of a side, ``envs_per_worker * max(workers, 1)``).
    """
    n_envs = envs_per_worker * max(workers, 1)
    chunks = {h: max(1, steps // (rounds * n_envs * h)) for h in horizons}  # chunks per env per block
    t0 = time.perf_counter()
    raw = RawSide(case, workers, envs_per_worker, seed)
    try:
        ours = OursSide(case, workers, envs_per_worker, seed)
        try:
            sides = {"raw": raw, "ours": ours}
            for h in horizons:  # untimed warm-up
                for side in sides.values():
                    side.run(-(-case.warmup // h), h)
            setup = time.perf_counter() - t0
            keys = [(h, name) for h in horizons for name in sides]
            wall, cpu, resets = dict.fromkeys(keys, 0.0), dict.fromkeys(keys, 0.0), dict.fromkeys(keys, 0)
            ratios: dict[int, list[float]] = {h: [] for h in horizons}
            for r in range(rounds):
                order = ("raw", "ours") if r % 2 == 0 else ("ours", "raw")
                for h in horizons:
                    t = {}
                    for name in order:
                        s = time.perf_counter()
                        block_cpu, block_resets = sides[name].run(chunks[h], h)
                        t[name] = time.perf_counter() - s
                        wall[h, name] += t[name]
                        cpu[h, name] += block_cpu
                        resets[h, name] += block_resets
                    ratios[h].append(t["raw"] / t["ours"])
            return [
                Result(
                    case.name, workers, envs_per_worker, h, chunks[h] * h * rounds * n_envs,
                    wall[h, "raw"], wall[h, "ours"],
                    cpu[h, "raw"], cpu[h, "ours"], ratios[h], resets[h, "raw"], resets[h, "ours"], setup,
                )
                for h in horizons
            ]
        finally:
            ours.close()
    finally:
        raw.close()


# ------------------------------------------------------------------ report

def table_rows(results: list[Result]) -> list[str]:
    """The markdown table rows of the results."""
    rows = []
    for r in results:
        case = CASES[r.case]
        label = f"{case.env_id} {case.options.get('obs_mode', '')}"
        if case.note:
            label += f" ({case.note})"
        rows.append(
            f"| {label} | {r.workers} | {r.envs_per_worker} | {r.mode} | {r.steps} | {r.raw_sps:.1f} | "
            f"{r.ours_sps:.1f} | {r.ratio:.2f} | "
            f"{r.median_block_ratio:.2f} [{min(r.block_ratios):.2f}-{max(r.block_ratios):.2f}] | "
            f"{1e3 * r.raw_cpu / r.steps:.2f} / {1e3 * r.ours_cpu / r.steps:.2f} | {r.raw_resets}/{r.ours_resets} |"
        )
    return rows


def markdown(rows: list[str], wall_s: float) -> str:
    """What is measured and the table."""
    lines = [
        "Env-steps per second, aggregate over workers, of the raw simulator vs our layer (`sim.make_env`) on the "
        "same task, random actions in the action box, fixed seeds (one env: the same actions on both sides; more: "
        "different streams, so the reset counts can differ), warm-up excluded, both sides paying their auto-resets. "
        "`W` = `workers`, `N` = `envs/worker`: raw = W independent spawned processes each stepping N "
        "independent envs one after another (each chunk on env 1, then env 2, ...) with no pipe in the loop "
        "(W = 0: the N envs in this process); ours = `make_env(num_envs=N * max(W, 1), num_workers=W)` (N envs "
        "per worker process). `mode`: `step` = ours calls `env.step` once per batch step, raw steps each env "
        "once, both build the full observation (rendered, in `rgb`) every step; `chunk H` = ours calls "
        "`env.step_chunk` on `[num_envs, H, A]` chunks of random actions, raw steps each env H times per chunk and "
        "reads only the last observation (MuJoCo: both sides render once per chunk, plus where an episode ends; "
        "ManiSkill and LIBERO: both still build the full observation every step); an env whose episode ends "
        "inside a chunk is reset and held still (zero actions) for the rest of it on both sides, and every "
        "executed step counts. Timed blocks alternate raw/ours (ABBA) so both see the same load; `ratio` = "
        "ours/raw steps/s over all blocks, `blocks` = median [min-max] of the per-block ratios. `CPU ms/step` = "
        "CPU time (user + system) of every process on that side (ours: this process and its env workers) per "
        f"env-step: the load-independent cost. {wall_s / 60:.1f} min, load average {os.getloadavg()[0]:.1f} at the "
        f"end, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}: absolute numbers are noisy, ratios "
        "less so.",
        "",
        "| case | workers | envs/worker | mode | steps/side | raw steps/s | ours steps/s | ratio ours/raw | "
        "blocks | CPU ms/step raw / ours | resets raw/ours |",
        "|---|---:|---:|---|---:|---:|---:|---:|---|---|---|",
        *rows,
        "",
        "With workers, ours pays one synchronous pipe round trip per message (per batch step in `step` mode, per "
        "chunk in `chunk` mode; actions, observations and rewards travel through shared memory), and each step or "
        "chunk waits for the slower worker, while raw workers never wait for each other. That cost is per "
        "message, not per env: visible against a ~1-1.5 ms MuJoCo step with one env per worker, shared by a "
        "worker's envs with more, and lost in the ~35 ms ManiSkill rgb and ~100 ms LIBERO steps.",
    ]
    return "\n".join(lines)


def main() -> None:
    """Parse flags, run the selected cases, print and publish the table."""
    p = argparse.ArgumentParser(description="steps/s of sim.make_env vs the raw simulator, interleaved")
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES), help="subset of cases")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2],
                   help="worker counts (0 = the envs in this process, both sides)")
    p.add_argument("--envs-per-worker", type=int, default=1, metavar="N",
                   help="envs per worker process (W = 0: envs in this process), both sides")
    p.add_argument("--steps", type=int, default=0, help="env-steps per side per case (0: each case's default)")
    p.add_argument("--rounds", type=int, default=8, help="interleaved timed blocks per side and mode")
    p.add_argument("--chunk", type=int, default=4, metavar="H",
                   help="also time env.step_chunk on H-step chunks against a raw loop doing the same (0 or 1: off)")
    p.add_argument("--quick", action="store_true", help="small step budgets (env start-ups then dominate the run time)")
    p.add_argument("--seed", type=int, default=0)
    args = harness.add_output_args(p).parse_args()
    if args.envs_per_worker < 1:
        p.error("--envs-per-worker must be >= 1")
    _set_threads()
    import sim  # noqa: F401  registers the backends before any worker starts

    horizons = [1] + ([args.chunk] if args.chunk > 1 else [])
    n = args.envs_per_worker
    t0 = time.perf_counter()
    results = []
    for name in args.cases:
        case = CASES[name]
        steps = args.steps or (case.quick_steps if args.quick else case.steps)
        for w in args.workers:
            for r in measure(case, w, n, steps, args.rounds, args.seed, horizons):
                results.append(r)
                print(
                    f"{name:16s} W={w} N={n} {r.mode:8s} steps={r.steps:5d} raw {r.raw_sps:8.1f}/s "
                    f"ours {r.ours_sps:8.1f}/s ratio {r.ratio:.2f} (blocks {r.median_block_ratio:.2f} "
                    f"[{min(r.block_ratios):.2f}-{max(r.block_ratios):.2f}]) "
                    f"cpu ms/step {1e3 * r.raw_cpu / r.steps:.2f}/{1e3 * r.ours_cpu / r.steps:.2f} "
                    f"resets {r.raw_resets}/{r.ours_resets} setup {r.setup_s:.0f}s",
                    file=sys.stderr, flush=True,
                )
    section = markdown(table_rows(results), time.perf_counter() - t0)
    print(section)
    harness.publish("sim_throughput", args, section, rows=[asdict(r) for r in results])


if __name__ == "__main__":
    main()
