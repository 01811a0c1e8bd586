"""Expert demonstrations: a vectorized env's scripted expert recorded into a LeRobotDataset v3."""

from __future__ import annotations

from pathlib import Path

import torch
from tqdm import tqdm

from sim import VecEnv
from sim.dataset import EpisodeRecorder


def collect_demos(
    env: VecEnv, root: Path, episodes: int, repo_id: str, only_success: bool = True, max_attempts: int = 0,
    action_noise: float = 0.0, seed: int = 0, max_frames: int = 0,
) -> dict[str, int]:
    """Record ``episodes`` expert episodes from ``env`` into a new dataset at ``root``.

    Every env runs its own episode; frames are buffered per env and written
    when that env's episode ends (kept only if successful when ``only_success``).
    With ``action_noise > 0`` the env executes the expert action plus Gaussian
    noise of that std (seeded by ``seed``, clipped to the action bounds) while
    the dataset records the clean expert action (DART, Laskey et al. 2017): the
    demos then visit states slightly off the expert's path and label how the
    expert recovers from them, which few-shot imitation needs most.

    With ``max_frames > 0`` recording stops once that many frames are saved:
    the episode that would pass the limit is kept up to it (its first frames),
    so a budget of expert steps is spent exactly; fewer than ``episodes``
    episodes are then not an error.

    Returns:
        ``{"saved": n, "attempted": m, "successes": k, "frames": f}``.

    Raises:
        ValueError: when ``action_noise`` is negative.
        RuntimeError: when fewer than ``episodes`` could be saved within ``max_attempts``.
    """
    max_attempts = max_attempts or 3 * episodes
    if action_noise < 0:
        raise ValueError(f"action_noise must be >= 0, got {action_noise}")
    gen = torch.Generator().manual_seed(seed)
    low = env.spec.action.low if env.spec.action.low is not None else -1.0
    high = env.spec.action.high if env.spec.action.high is not None else 1.0
    rec = EpisodeRecorder(root, repo_id, env.spec, fps=round(env.spec.control_freq))
    buffers: list[list[tuple]] = [[] for _ in range(env.num_envs)]
    obs = env.reset()
    attempted = successes = frames = 0

    def budget_spent() -> bool:
        return bool(max_frames) and frames >= max_frames

    with tqdm(total=episodes, desc=f"collect {env.spec.env_id}", unit="ep") as bar:
        while rec.num_episodes < episodes and attempted < max_attempts and not budget_spent():
            actions = env.expert_actions()
            prev = obs
            executed = actions
            if action_noise > 0:
                noise = torch.randn(actions.shape, generator=gen) * action_noise
                executed = (actions + noise.to(actions.dtype)).clamp(low, high)
            obs, reward, term, trunc, info = env.step(executed)
            done = term | trunc
            for i in range(env.num_envs):
                row = {k: (v[i] if isinstance(v, torch.Tensor) else v[i]) for k, v in prev.items()}
                buffers[i].append((row, actions[i], float(reward[i]), bool(info["success"][i])))
                if not done[i]:
                    continue
                attempted += 1
                ok = bool(info["episode"]["success"][i])
                successes += ok
                if (ok or not only_success) and rec.num_episodes < episodes and not budget_spent():
                    if max_frames:
                        del buffers[i][max_frames - frames:]
                    for row_i, a, r, s in buffers[i]:
                        batched = {k: ([v] if k == "task" else v[None]) for k, v in row_i.items()}
                        rec.add_frame(batched, a, r, s)
                    frames += len(buffers[i])
                    rec.save_episode()
                    bar.update(1)
                buffers[i] = []
                bar.set_postfix(success=f"{successes}/{attempted}")
    if rec.num_episodes < episodes and not budget_spent():
        raise RuntimeError(
            f"{env.spec.env_id}: only {rec.num_episodes}/{episodes} successful expert episodes in {attempted} attempts"
        )
    rec.finalize()
    return {"saved": rec.num_episodes, "attempted": attempted, "successes": successes, "frames": frames}
