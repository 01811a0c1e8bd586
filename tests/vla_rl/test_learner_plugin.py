"""Adding an algorithm is adding files: a learner registered from this test module alone runs under ``vla-rl train``.

Nothing outside this file names ``toy-reinforce``: the config is a draccus choice
(``--algo.type``), the trainer reads only the learner interface
(:mod:`vla_rl.algorithms.base`), and ``--help`` lists the chosen learner's fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from vla_rl.algorithms.base import ALGORITHMS, IterationInputs, Learner, LearnerConfig, Needs, register_learner
from vla_rl.cli import run
from vla_rl.rollout import Rollout


@dataclass
class ToyReinforceConfig(LearnerConfig):
    """REINFORCE on whole-rollout returns, no critic (``--algo.type toy-reinforce``)."""

    decisions_per_iter: int = 4
    """Chunks collected per env per iteration."""
    lr: float = 1e-3
    """Learning rate."""


@register_learner("toy-reinforce", ToyReinforceConfig)
class ToyReinforceLearner(Learner):
    """``-mean((R - mean R) * logp)`` over a rollout's decisions (the return of each env's rollout)."""

    needs = Needs.ON_POLICY
    uses_critic = False
    collected: list[int] = []
    syncs: list[bool] = []

    def __init__(self, cfg: ToyReinforceConfig, policy) -> None:
        super().__init__(cfg, policy)
        self.optimizer = torch.optim.SGD(policy.actor_parameters(), lr=cfg.lr)

    def collect(self, inputs: IterationInputs) -> Rollout:
        assert inputs.engine is not None
        ToyReinforceLearner.collected.append(inputs.seed_base)
        ToyReinforceLearner.syncs.append(inputs.sync)
        if inputs.reset:
            inputs.engine.reset(seed=inputs.seed_base)
        return inputs.engine.collect(self.cfg.decisions_per_iter)

    def update(self, rollout: Rollout) -> dict[str, float]:
        returns = (rollout.rewards * rollout.valid).sum(0)  # [B]
        adv = (returns - returns.mean())[None, :].expand_as(rollout.rewards).flatten()
        idx = rollout.valid.flatten().nonzero().flatten()
        logp, _, _ = self.policy.evaluate(rollout.flat_obs(idx), {k: v.flatten(0, 1)[idx] for k, v in rollout.extras.items()})
        logp = logp.reshape(len(idx), -1).sum(-1)
        loss = -(adv[idx] * logp).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.iteration += 1
        return {"update/toy_loss": float(loss.detach())}


ARGS = [
    "train", "--algo.type", "toy-reinforce", "--algo.lr", "0.01", "--smoke", "true", "--iterations", "2",
    "--env.id", "mujoco/pick-red", "--policy.type", "compact-flow",
]


def test_a_learner_registered_in_a_test_module_runs_under_vla_rl_train(tmp_path: Path) -> None:
    assert "toy-reinforce" in ALGORITHMS
    ToyReinforceLearner.collected.clear()
    result = run([*ARGS, "--run_dir", str(tmp_path / "run")])
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["update/toy_loss"] for r in rows if "update/toy_loss" in r]
    assert len(losses) == 2 and all(abs(v) < 1e6 for v in losses)
    assert len(ToyReinforceLearner.collected) == 2 and ToyReinforceLearner.collected[0] != ToyReinforceLearner.collected[1]
    assert result["after"] is not None and result["after"].episodes > 0
    assert (tmp_path / "run" / "checkpoints").is_dir()


def test_the_loop_asks_for_a_synced_policy_exactly_before_evaluations_and_the_end(tmp_path: Path) -> None:
    """``IterationInputs.sync`` lets a learner defer its update to the next collection (``filtered_bc --algo.overlap``)
    except where the loop evaluates the weights; checkpoints (every 3 iterations here) do not force it."""
    import dataclasses

    from vla_rl.cli import parse_config
    from vla_rl.smoke import apply_smoke
    from vla_rl.train_config import TrainConfig
    from vla_rl.trainer import Trainer

    small = apply_smoke(parse_config(TrainConfig, [*ARGS[1:], "--run_dir", str(tmp_path / "r")]))  # smoke: 2 its
    cfg = dataclasses.replace(small, iterations=7, checkpoint_every=3, eval=dataclasses.replace(small.eval, every=4))
    ToyReinforceLearner.syncs.clear()
    Trainer(cfg).run()
    assert ToyReinforceLearner.syncs == [False, False, False, True, False, False, True]  # 4: evaluation; 7: the end
    assert sorted(p.name for p in (tmp_path / "r" / "checkpoints").glob("iter_*")) == [
        "iter_000003", "iter_000006", "iter_000007"]


def test_the_learner_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    run([*ARGS, "--iterations", "1", "--run_dir", str(tmp_path / "run")])
    ToyReinforceLearner.collected.clear()
    run([*ARGS, "--run_dir", str(tmp_path / "run"), "--resume", "true"])
    assert len(ToyReinforceLearner.collected) == 1  # only the second iteration ran


def test_help_lists_the_chosen_learners_fields(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run(["train", "--algo.type", "toy-reinforce", "--help"])
    out = capsys.readouterr().out
    assert "--algo.lr " in out and "--algo.decisions_per_iter" in out
    assert "--algo.group_size" not in out and "--algo.lam" not in out  # GRPO's and PPO's own fields


def test_an_unknown_algorithm_names_the_field_and_the_valid_types(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        run(["train", "--algo.type", "toy-reinforc"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "algo.type" in err and "toy-reinforce" in err and "ppo" in err
