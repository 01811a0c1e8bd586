"""``vla-rl train``: RL fine-tuning (PPO / GRPO) of any registered policy in any env."""

from __future__ import annotations

from typing import Any

from vla_rl.commands import COMMANDS
from vla_rl.smoke import apply_smoke
from vla_rl.train_config import TrainConfig
from vla_rl.trainer import Trainer


@COMMANDS.register("train", config=TrainConfig, help="fine-tuning with any registered learner (PPO, GRPO, ...): evaluation, logging, checkpoints")
def train(cfg: TrainConfig) -> dict[str, Any]:
    result = Trainer(apply_smoke(cfg)).run()
    before, after = result["before"], result["after"]
    if not result.get("main", True):  # another rank of a distributed run: rank 0 reports
        return result
    if before is not None and after is not None:
        print(f"success {before.success_rate:.2f} -> {after.success_rate:.2f} "
              f"(95% CI {after.ci_low:.2f}-{after.ci_high:.2f}, {after.episodes} episodes)")
    print(f"run folder: {result['run_dir']}")
    return result
