"""``vla-rl rollout`` and ``vla-rl envs``: run a policy in any env, with video."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from sim import Obs, VecEnv, list_envs
from sim.video import VideoWriter
from vla_rl.commands import COMMANDS
from vla_rl.config import RolloutConfig, default_runs_dir

ActionFn = Callable[[Obs], torch.Tensor]  # obs -> actions [B, H, A]


def action_source(name: str, env: VecEnv, seed: int) -> ActionFn:
    """``random`` (uniform in the action box), ``expert`` or a policy checkpoint folder."""
    if name == "random":
        gen = torch.Generator().manual_seed(seed)
        shape = (env.num_envs, 1, env.spec.action_dim)
        return lambda obs: torch.rand(shape, generator=gen) * 2 - 1
    if name == "expert":
        return lambda obs: env.expert_actions()[:, None, :]
    from policies import ActMode
    from policies.registry import load_policy

    policy = load_policy(name)
    policy.eval()

    def act(obs: Obs) -> torch.Tensor:
        with torch.no_grad():
            return policy.act(obs, ActMode.EVAL).actions

    return act


@dataclass
class RolloutStats:
    """Outcome of :func:`run_episodes`."""

    episodes: int
    successes: int
    mean_return: float
    mean_length: float
    video: str | None

    @property
    def success_rate(self) -> float:
        return self.successes / max(1, self.episodes)


def run_episodes(env: VecEnv, act: ActionFn, episodes: int, video: VideoWriter | None = None, desc: str = "rollout") -> RolloutStats:
    """Step ``env`` with action chunks from ``act`` until ``episodes`` episodes have ended.

    A chunk ``[B, H, A]`` is executed open-loop for H steps; envs that end
    inside a chunk restart and simply continue with the chunk's remaining actions.
    """
    obs = env.reset()
    done_eps, succ, returns, lengths = 0, 0, [], []
    with tqdm(total=episodes, desc=desc, unit="ep") as bar:
        while done_eps < episodes:
            chunk = act(obs)
            for h in range(chunk.shape[1]):
                obs, _, _, _, info = env.step(chunk[:, h])
                if video is not None:
                    video.add_obs(obs, env.spec.image_keys)
                if "episode" in info:
                    ended = info["done"].nonzero().flatten().tolist()
                    for i in ended[: episodes - done_eps]:
                        done_eps += 1
                        succ += int(info["episode"]["success"][i])
                        returns.append(float(info["episode"]["return"][i]))
                        lengths.append(int(info["episode"]["length"][i]))
                    bar.update(min(len(ended), bar.total - bar.n))
                    bar.set_postfix(success=f"{succ}/{done_eps}")
                if done_eps >= episodes:
                    break
    path = video.close() if video is not None else None
    return RolloutStats(
        episodes=done_eps,
        successes=succ,
        mean_return=sum(returns) / max(1, len(returns)),
        mean_length=sum(lengths) / max(1, len(lengths)),
        video=str(path) if path else None,
    )


@COMMANDS.register("rollout", config=RolloutConfig, help="run a policy (random, expert or checkpoint) in an env")
def rollout(cfg: RolloutConfig) -> RolloutStats:
    out = Path(cfg.output_dir) if cfg.output_dir else default_runs_dir() / f"rollout-{cfg.env.id.replace('/', '-')}"
    with cfg.env.make() as env:
        act = action_source(cfg.policy, env, cfg.env.seed)
        video = VideoWriter(out / "rollout.mp4", env.spec.control_freq) if cfg.video else None
        stats = run_episodes(env, act, cfg.episodes, video)
    out.mkdir(parents=True, exist_ok=True)
    summary = {**asdict(stats), "success_rate": stats.success_rate, "env_id": cfg.env.id, "policy": cfg.policy}
    (out / "rollout.json").write_text(json.dumps(summary, indent=2))
    print(f"{cfg.env.id}: success {stats.successes}/{stats.episodes}, mean return {stats.mean_return:.2f}")
    if stats.video:
        print(f"video: {stats.video}")
    print(f"summary: {out / 'rollout.json'}")
    return stats


@dataclass
class EnvsConfig:
    """``vla-rl envs``: list every env id."""

    prefix: str = ""
    """Only ids starting with this."""


@COMMANDS.register("envs", config=EnvsConfig, help="list env ids")
def envs(cfg: EnvsConfig) -> list[str]:
    ids = [e for e in list_envs() if e.startswith(cfg.prefix)]
    print("\n".join(ids))
    return ids
