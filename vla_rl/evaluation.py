"""Deterministic evaluation on a fixed, held-out set of episodes.

Env ``i`` of an evaluation env built with seed ``s`` plays its episodes from
its own seeded stream, and contributes exactly its first ``ceil(N / B)``
episodes (the total trimmed to ``N`` in env order). So the set of initial
states depends only on ``(s, N, B)``, never on the policy, and two policies
evaluated with the same settings face the same episodes.

Chunks run as in training, through :meth:`sim.core.VecEnv.step_chunk`: an env
whose episode ends inside a chunk is auto-reset and held still (zero actions)
for the rest of the chunk (:mod:`sim.chunk`), and its next episode starts with
a fresh decision. An episode's statistics (return: the env's own reward, the
``env`` term; length; success) are those the env reports at its end; the held
steps count towards the next episode's length and return, as in training. An
episode that ends while its env is held still (a second end in one chunk, only
possible with episodes shorter than a chunk) played no action of the policy and
is not counted.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from policies.base import ActMode, Policy
from sim.chunk import first_episode_steps
from sim.core import TASK, EnvError, Obs, VecEnv
from sim.tasks import TASK_INDEX, Assignment, split_plans
from sim.video import VideoWriter

ActionFn = Callable[[Obs], torch.Tensor]  # obs -> action chunk [B, H, A]


def wilson_interval(successes: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """95% (z = 1.96) Wilson score interval of a success rate; ``(0, 1)`` when ``n == 0``."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_difference(base: Sequence[dict[str, str]], other: Sequence[dict[str, str]],
                      z: float = 1.96) -> tuple[float, float, float, int]:
    """``other`` minus ``base`` success, episode by episode: ``(mean difference, low, high, pairs)``.

    Each argument is a list of :attr:`EvalResult.outcomes` (one per seed, say), ``base[i]`` and ``other[i]``
    evaluated on the same seed so that episode ``k`` of a task starts from the same state in both. With equal
    episodes per task the mean difference is the difference of the means over tasks. The interval is the 95%
    normal interval of the mean of the paired differences (each -1, 0 or +1): the evaluation's noise for these
    policies, narrower than two separate Wilson intervals when both solve and fail the same states.

    Raises:
        ValueError: naming the task when the two sides do not hold the same tasks and episode counts.
    """
    if len(base) != len(other):
        raise ValueError(f"paired_difference: {len(base)} base evaluations against {len(other)}")
    diffs: list[int] = []
    for i, (a, b) in enumerate(zip(base, other)):
        if sorted(a) != sorted(b):
            raise ValueError(f"paired_difference: evaluation {i} has tasks {sorted(a)} against {sorted(b)}")
        for task, seq in a.items():
            if len(seq) != len(b[task]):
                raise ValueError(f"paired_difference: evaluation {i}, task {task}: {len(seq)} episodes against "
                                 f"{len(b[task])}")
            diffs += [int(y) - int(x) for x, y in zip(seq, b[task])]
    n = len(diffs)
    if n == 0:
        return 0.0, -1.0, 1.0, 0
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / max(1, n - 1)
    half = z * math.sqrt(var / n)
    return mean, mean - half, mean + half, n


@dataclass
class EvalResult:
    """Outcome of :func:`evaluate_episodes`."""

    episodes: int
    successes: int
    success_rate: float
    ci_low: float
    ci_high: float
    mean_return: float
    mean_length: float
    per_task: dict[str, dict[str, float]] = field(default_factory=dict)
    video: str | None = None
    protocol: str = "seeds"
    outcomes: dict[str, str] = field(default_factory=dict)
    """``per_task`` protocol: each task's successes as a string of ``0`` / ``1``, character ``k`` its episode ``k``
    (init state / seed ``k``), so two policies' evaluations on the same seed pair up episode by episode
    (:func:`paired_difference`)."""

    def scalars(self, prefix: str = "eval/") -> dict[str, float]:
        """Flat metrics for logging."""
        out = {
            f"{prefix}success": self.success_rate, f"{prefix}success_ci_low": self.ci_low,
            f"{prefix}success_ci_high": self.ci_high, f"{prefix}return": self.mean_return,
            f"{prefix}length": self.mean_length,
        }
        for task, row in self.per_task.items():
            out[f"{prefix}task/{task}"] = row["success"]
        if self.protocol == "per_task":  # LIBERO's headline number: the mean over tasks
            out[f"{prefix}success_task_mean"] = self.success_rate
        return out


@dataclass
class EvalShard:
    """This process's part of an evaluation spread over processes (:mod:`vla_rl.distributed`).

    Attributes:
        total_envs: evaluation envs over all processes.
        offset: index of this process's first env among them (its env ``i`` is seeded ``seed + offset + i``).
        gather: every process's episode records, concatenated (a collective: all processes call it).
    """

    total_envs: int
    offset: int
    gather: Callable[[list], list]


@dataclass(frozen=True)
class PlayedEpisode:
    """One counted episode of :func:`play_episodes`: its env slot, its index among that slot's episodes (``k``), its
    task (name and index; -1 on an env without task indices), return, length and success."""

    env: int
    k: int
    task: str
    task_index: int
    ret: float
    length: int
    success: bool


def play_episodes(
    env: VecEnv,
    act: ActionFn,
    quota: Sequence[int],
    seed: int,
    exec_steps: int = 0,
    desc: str = "eval",
    progress: bool = True,
    video: VideoWriter | None = None,
    video_envs: int = 4,
    filmed: int = 0,
) -> list[PlayedEpisode]:
    """The evaluation loop: reset ``env`` with ``seed``, act chunk by chunk until env slot ``i`` has ended
    ``quota[i]`` episodes (see module doc), in step then env order.

    With ``video``, the first ``video_envs`` envs' cameras are rendered every step (:meth:`VecEnv.step_chunk` with
    ``record_obs``) until each of them has played ``filmed`` episodes; after that the chunks run batched.
    """
    counts = [0] * env.num_envs
    episodes: list[PlayedEpisode] = []
    obs = env.reset(seed=seed)
    if video is not None:
        video.add_obs(obs, env.spec.image_keys, video_envs)
    with tqdm(total=sum(quota), desc=desc, unit="ep", disable=not progress, leave=False) as bar:
        while any(c < q for c, q in zip(counts, quota)):
            chunk = act(obs)
            steps = chunk.shape[1] if exec_steps <= 0 else min(exec_steps, chunk.shape[1])
            record = video is not None and min(counts[:video_envs]) < filmed
            out = env.step_chunk(chunk[:, :steps], record_obs=True) if record else env.step_chunk(chunk[:, :steps])
            obs = out.obs
            if record:
                for step_obs in out.step_obs or []:
                    video.add_obs(step_obs, env.spec.image_keys, video_envs)  # type: ignore[union-attr]
            ends = (out.terminated | out.truncated) & first_episode_steps(out.terminated, out.truncated)
            for h, i in ends.nonzero().tolist():  # step order, then env order: at most one end per env
                if counts[i] < quota[i]:
                    task_index = int(out.final_obs[TASK_INDEX][i]) if TASK_INDEX in out.final_obs else -1
                    episodes.append(PlayedEpisode(i, counts[i], out.final_obs[TASK][i], task_index,
                                             float(out.episode_return[h, i]), int(out.episode_length[h, i]),
                                             bool(out.success[h, i])))
                    counts[i] += 1
                    bar.update(1)
    return episodes


def evaluate_episodes(
    env: VecEnv,
    act: ActionFn,
    episodes: int,
    seed: int,
    exec_steps: int = 0,
    video_path: str | Path | None = None,
    video_envs: int = 4,
    desc: str = "eval",
    progress: bool = True,
    shard: EvalShard | None = None,
    video_episodes: int = 0,
) -> EvalResult:
    """Run ``episodes`` episodes (see module doc) and summarize them.

    Args:
        env: the env; it is reset with ``seed``.
        act: maps a batch observation to an action chunk ``[B, H, A]``.
        episodes: N, the number of episodes.
        seed: base seed of the evaluation episodes (keep it away from training seeds).
        exec_steps: actions of each chunk to execute (0 = all).
        video_path: write an MP4 of the first ``video_envs`` envs' cameras there (every step is then
            rendered, :meth:`sim.core.VecEnv.step_chunk` with ``record_obs``, until each of those envs has
            played ``video_episodes`` episodes, or all of its share with 0; after that the chunks run batched,
            without the renders nobody reads).
        video_episodes: episodes of each video env the video shows (0: every episode it plays).
        shard: when ``env`` holds envs ``[offset, offset + num_envs)`` of an evaluation spread over several
            processes: they play their share and the episodes of all are gathered before the summary, which is
            then the one a single env of ``shard.total_envs`` envs would give (same seeds, same trimming).
    """
    b = env.num_envs
    quota = math.ceil(episodes / (shard.total_envs if shard is not None else b))
    filmed = min(quota, video_episodes) if video_episodes > 0 else quota  # episodes per video env the video shows
    video = VideoWriter(video_path, env.spec.control_freq) if video_path and env.spec.image_keys else None
    played = play_episodes(env, act, [quota] * b, seed, exec_steps, desc, progress, video, video_envs, filmed)
    records = [(e.env, e.k, e.task, e.ret, e.length, e.success) for e in played]
    if shard is not None:
        records = shard.gather([(r[0] + shard.offset, *r[1:]) for r in records])
    records.sort(key=lambda r: (r[1], r[0]))  # round-robin over envs, then trim to N
    records = records[:episodes]
    succ = sum(r[5] for r in records)
    lo, hi = wilson_interval(succ, len(records))
    per: dict[str, list[tuple[float, int, bool]]] = defaultdict(list)
    for r in records:
        per[r[2]].append((r[3], r[4], r[5]))
    per_task = {
        task: {"episodes": len(v), "success": sum(x[2] for x in v) / len(v)} for task, v in sorted(per.items())
    }
    path = video.close() if video is not None else None
    return EvalResult(
        episodes=len(records), successes=succ, success_rate=succ / max(1, len(records)), ci_low=lo, ci_high=hi,
        mean_return=sum(r[3] for r in records) / max(1, len(records)),
        mean_length=sum(r[4] for r in records) / max(1, len(records)),
        per_task=per_task, video=str(path) if path else None,
    )


def evaluate_policy(
    env: VecEnv,
    policy: Policy,
    episodes: int,
    seed: int,
    exec_steps: int = 0,
    video_path: str | Path | None = None,
    video_envs: int = 4,
    desc: str = "eval",
    progress: bool = True,
    tasks: Sequence[int] | None = None,
    episodes_per_task: int = 50,
    shard: EvalShard | None = None,
    first_init: int = 0,
    video_episodes: int = 0,
) -> EvalResult:
    """:func:`evaluate_episodes` (or, given ``tasks``, :func:`evaluate_per_task`) of ``policy``'s deterministic actions (:attr:`ActMode.EVAL`), on its own RNG stream.

    The stream is seeded with ``seed``, like the env: the same policy always scores the same, two
    policies evaluated with the same ``seed`` start from the same flow noise (common random
    numbers), and the caller's RNG is left untouched. The policy's episode state is reset after.
    """

    def act(obs: Obs) -> torch.Tensor:
        with torch.no_grad():
            return policy.act(obs, ActMode.EVAL).actions

    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        if tasks is not None:
            res = evaluate_per_task(env, act, tasks, episodes_per_task, seed, exec_steps, desc, progress, first_init)
        else:
            res = evaluate_episodes(env, act, episodes, seed, exec_steps, video_path, video_envs, desc, progress,
                                    shard, video_episodes)
    policy.reset()
    return res


def evaluate_per_task(
    env: VecEnv,
    act: ActionFn,
    tasks: Sequence[int],
    episodes_per_task: int,
    seed: int,
    exec_steps: int = 0,
    desc: str = "eval",
    progress: bool = True,
    first_init: int = 0,
) -> EvalResult:
    """The benchmarks' protocol on a multi-task env: every task of ``tasks`` for ``episodes_per_task`` episodes.

    Episode ``k`` of task ``t`` is :class:`sim.tasks.Assignment` ``(t, init=first_init + k, seed=seed + k)``: on
    LIBERO suites the benchmark's fixed init state ``first_init + k`` (LIBERO's protocol: 50 per task, each once;
    ``first_init`` skips the init states training draws from), elsewhere
    seed ``seed + k`` (ManiSkill's fixed seeds per task). The episodes are dealt round-robin over the env
    slots as queued assignments, so auto-resets inside worker processes follow them; slot ``i`` counts
    exactly the episodes it was dealt. The headline ``success_rate`` is the mean of the per-task rates
    (LIBERO's average over tasks; with equal episodes per task it equals the pooled rate, whose 95%
    Wilson interval is ``ci_low`` / ``ci_high``); ``per_task[name]`` has each task's episodes, success,
    95% interval, mean return and length.

    Raises:
        EnvError: for a single-task env or a task index out of range.
    """
    names = env.spec.tasks
    if not names:
        raise EnvError(f"{env.spec.env_id}: eval.protocol per_task needs a multi-task env (EnvSpec.tasks is empty)")
    plan = [Assignment(t, init=first_init + k, seed=seed + k) for k in range(episodes_per_task) for t in tasks]
    plans = split_plans(plan, env.num_envs)
    quota = [len(plans[i]) for i in range(env.num_envs)]
    env.schedule_tasks(plans=plans)
    try:
        played = play_episodes(env, act, quota, seed, exec_steps, desc, progress)
    finally:
        env.schedule_tasks(plans={i: [] for i in range(env.num_envs)})
    # task, return, length, success, episode k of the task (slot i plays its plan in order)
    records = [(e.task_index, e.ret, e.length, e.success, plans[e.env][e.k].seed - seed) for e in played]
    per_task: dict[str, dict[str, float]] = {}
    outcomes: dict[str, str] = {}
    for t in sorted(set(tasks)):
        rows = [r for r in records if r[0] == t]
        outcomes[names[t]] = "".join(str(int(r[3])) for r in sorted(rows, key=lambda r: r[4]))
        wins = sum(r[3] for r in rows)
        lo, hi = wilson_interval(wins, len(rows))
        per_task[names[t]] = {
            "episodes": len(rows), "success": wins / max(1, len(rows)), "ci_low": lo, "ci_high": hi,
            "return": sum(r[1] for r in rows) / max(1, len(rows)), "length": sum(r[2] for r in rows) / max(1, len(rows)),
        }
    succ = sum(r[3] for r in records)
    lo, hi = wilson_interval(succ, len(records))
    n = max(1, len(records))
    return EvalResult(
        episodes=len(records), successes=succ,
        success_rate=sum(row["success"] for row in per_task.values()) / max(1, len(per_task)),
        ci_low=lo, ci_high=hi, mean_return=sum(r[1] for r in records) / n,
        mean_length=sum(r[2] for r in records) / n, per_task=per_task, protocol="per_task", outcomes=outcomes,
    )
