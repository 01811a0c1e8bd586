"""``vla-rl collect``: scripted-expert demonstrations as a LeRobotDataset v3."""

from __future__ import annotations

from pathlib import Path

from vla_rl.commands import COMMANDS
from vla_rl.config import CollectConfig
from vla_rl.data.demos import collect_demos


def default_demo_dir(env_id: str, seed: int) -> Path:
    """``data/<env id with / as ->-expert-s<seed>``."""
    return Path("data") / f"{env_id.replace('/', '-')}-expert-s{seed}"


@COMMANDS.register("collect", config=CollectConfig, help="record scripted-expert demos as a LeRobotDataset v3")
def collect(cfg: CollectConfig) -> dict[str, int]:
    root = Path(cfg.output) if cfg.output else default_demo_dir(cfg.env.id, cfg.env.seed)
    with cfg.env.make() as env:
        stats = collect_demos(
            env, root, cfg.episodes, cfg.repo_id, cfg.only_success, cfg.max_attempts, cfg.action_noise, cfg.env.seed
        )
    print(
        f"saved {stats['saved']} episodes ({stats['frames']} frames) to {root}; "
        f"expert success {stats['successes']}/{stats['attempted']}"
    )
    return stats
