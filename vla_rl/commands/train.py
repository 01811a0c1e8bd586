"""``vla-rl train``: RL fine-tuning (PPO / GRPO) of any registered policy in any env."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from vla_rl.algorithms.sft import SFTConfig
from vla_rl.commands import COMMANDS
from vla_rl.config import ConfigError
from vla_rl.smoke import apply_smoke
from vla_rl.report import make_plots, write_report
from vla_rl.train_config import TrainConfig, policy_type
from vla_rl.trainer import Trainer


@COMMANDS.register("train", config=TrainConfig, help="fine-tuning with any registered learner (PPO, GRPO, ...): evaluation, logging, checkpoints")
def train(cfg: TrainConfig) -> dict[str, Any]:
    if isinstance(cfg.algo, SFTConfig) and cfg.algo.stop_at_success:
        raise ConfigError("algo.stop_at_success: the training loop runs its iterations; use `vla-rl sft` for a "
                          "success-based stop")
    cfg = apply_smoke(cfg)
    start = time.perf_counter()
    result = Trainer(cfg).run()
    result.setdefault("wall_seconds", time.perf_counter() - start)  # this process's share of a resumed run
    before, after = result["before"], result["after"]
    if not result.get("main", True):  # another rank of a distributed run: rank 0 reports
        return result
    if before is not None and after is not None:
        print(f"success {before.success_rate:.2f} -> {after.success_rate:.2f} "
              f"(95% CI {after.ci_low:.2f}-{after.ci_high:.2f}, {after.episodes} episodes)")
    md = write_train_report(cfg, result)
    print(f"run folder: {result['run_dir']} (report: {md})")
    return result


def write_train_report(cfg: TrainConfig, result: dict[str, Any]) -> Path:
    """``report.md`` / ``report.json`` of a finished run: overall and per-task success before and after, plots."""
    run_dir = Path(result["run_dir"])
    before, after = result["before"], result["after"]
    summary: dict[str, Any] = {
        "name": run_dir.name, "env_id": cfg.env.id, "policy": policy_type(cfg.policy), "algorithm": cfg.algo.type,
        "seed": cfg.seed, "env_steps": result["env_steps"], "eval_protocol": cfg.eval.protocol,
        "wall_seconds": result.get("wall_seconds", 0.0), "device": result.get("device"),
    }
    for tag, res in (("before", before), ("after", after)):
        if res is not None:
            summary[f"success_{tag}"] = res.success_rate
            summary[f"success_{tag}_ci"] = [res.ci_low, res.ci_high]
            summary[f"per_task_{tag}"] = res.per_task
            summary["episodes_per_eval"] = res.episodes
    plots = make_plots(run_dir / "metrics.jsonl", run_dir / "plots") if (run_dir / "metrics.jsonl").exists() else []
    return write_report(run_dir, summary, plots, {})
