"""One learner update on a whole batch, or on a shard of it as one rank of a DDP run (``test_distributed.py``).

``python -m torch.distributed.run --nproc_per_node 2 tests/vla_rl/ddp_equivalence.py ppo OUT`` makes every rank
build the same batch (same seeds: 4 MuJoCo envs, the smoke compact-flow policy), keep its half (PPO: envs
``[2r, 2r + 2)``; SFT: rows ``[4r, 4r + 4)``), wrap the learner with :meth:`Learner.distribute` and update once;
rank 0 saves the parameters to ``OUT``. The test runs :func:`update` on the whole batch in one process and compares.

Adam's ``eps`` is raised to 1e-3 in both runs: some gradients are zero in exact arithmetic (the compact policy's
attention over a single key gives its query / key projections none) and only float noise of ~1e-8 in practice,
which Adam with ``eps=1e-8`` turns into steps of up to the learning rate whose sign depends on summation order.
With 1e-3 such noise moves a weight by ~1e-8 while real gradients still take near-full steps.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import torch

from vla_rl.algorithms.base import Learner
from vla_rl.algorithms.ppo import PPOLearner
from vla_rl.algorithms.sft import SFTConfig, SFTLearner
from vla_rl.cli import parse_config
from vla_rl.data.chunks import ChunkBatch
from vla_rl.distributed import SINGLE, Distributed
from vla_rl.policy_factory import build_policy
from vla_rl.rollout import Rollout, RolloutEngine
from vla_rl.smoke import apply_smoke
from vla_rl.train_config import TrainConfig

NUM_ENVS = 4
SFT_ROWS = 8
ADAM_EPS = 1e-3


def _fixed_noise_sft_loss(policy: Any) -> Any:
    """``policy.sft_loss`` with its flow noise and times drawn per row from the row itself instead of the global RNG,
    so a row's loss does not depend on which process holds it (the RNG draws of two half-batches are not those of
    one whole batch)."""
    base = policy.sft_loss

    def loss(obs: dict[str, Any], actions: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        real_randn, real_sample = torch.randn_like, torch.distributions.Beta.sample
        torch.randn_like = lambda x, **kw: torch.sin(37.0 * x + 1.0)  # type: ignore[assignment]
        torch.distributions.Beta.sample = lambda self, shape=(): torch.full(tuple(shape), 0.4)  # type: ignore[method-assign]
        try:
            return base(obs, actions, mask)
        finally:
            torch.randn_like, torch.distributions.Beta.sample = real_randn, real_sample  # type: ignore[method-assign]

    return loss


def build(kind: str) -> tuple[Learner, Any]:
    """The learner (fresh smoke policy, seed 0) and its whole batch: a PPO rollout or a list of SFT batches."""
    torch.manual_seed(0)
    cfg = apply_smoke(parse_config(TrainConfig, ["--smoke", "true", "--env.id", "mujoco/pick-red",
                                                 "--env.obs_mode", "state", "--policy.type", "compact-flow"]))
    env = cfg.env.make(num_envs=NUM_ENVS, seed=0)
    try:
        policy = build_policy(cfg.policy, env.spec, smoke=True)
        if kind == "ppo":
            algo = dataclasses.replace(cfg.algo, epochs=2, minibatch_size=64, decisions_per_iter=2)
            learner: Learner = PPOLearner(algo, policy)
            engine = RolloutEngine(env, policy, cfg.exec_steps, use_critic=True, reward=cfg.reward)
            engine.reset(seed=100)
            torch.manual_seed(1)
            with torch.no_grad():
                batch: Any = engine.collect(algo.decisions_per_iter)
        else:
            learner = SFTLearner(SFTConfig(steps=4, image_shift=0, batch_size=SFT_ROWS), policy)
            obs = env.reset(seed=200)
            gen = torch.Generator().manual_seed(3)
            chunk = (policy.chunk_size, env.spec.action_dim)
            batch = []
            for _ in range(2):
                rows = torch.arange(SFT_ROWS) % NUM_ENVS
                state = {k: v[rows] for k, v in obs.items() if k != "task"}
                state["task"] = [obs["task"][i] for i in rows.tolist()]
                actions = torch.rand((SFT_ROWS, *chunk), generator=gen) * 2 - 1
                batch.append(ChunkBatch(state, actions, torch.ones(SFT_ROWS, chunk[0], dtype=torch.bool)))
            policy.sft_loss = _fixed_noise_sft_loss(policy)  # type: ignore[method-assign]
    finally:
        env.close()
    return learner, batch


def shard(kind: str, batch: Any, rank: int, world: int) -> Any:
    """Rank ``rank``'s part of the whole batch."""
    if kind == "ppo":
        n = batch.valid.shape[1] // world
        cols = slice(rank * n, (rank + 1) * n)

        def part(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                return x[:, cols] if x.dim() >= 2 else x[cols]
            if isinstance(x, dict):
                return {k: part(v) for k, v in x.items()}
            if isinstance(x, list) and x and isinstance(x[0], list):  # task strings [T][B]
                return [row[cols] for row in x]
            return x

        return Rollout(**{f.name: part(getattr(batch, f.name)) for f in dataclasses.fields(Rollout)})
    n = SFT_ROWS // world
    rows = slice(rank * n, (rank + 1) * n)
    return [ChunkBatch({k: v[rows] for k, v in b.obs.items()}, b.actions[rows], b.mask[rows]) for b in batch]


def update(kind: str, dist: Distributed = SINGLE) -> dict[str, torch.Tensor]:
    """Build, shard for ``dist``, update once; the policy's parameters after the update."""
    learner, batch = build(kind)
    learner.distribute(dist)
    batch = shard(kind, batch, dist.rank, dist.world_size)
    if kind == "sft":
        from vla_rl.algorithms.sft import SFTUpdater

        learner.updater = SFTUpdater(learner.policy, learner.cfg, seed=0)
        learner.updater.call = learner.call
    for opt in learner.optimizers():
        for group in opt.param_groups:
            group["eps"] = ADAM_EPS
    learner.update(batch)
    return {k: v.detach().clone() for k, v in learner.policy.state_dict().items()}


if __name__ == "__main__":
    dist = Distributed.from_environment()
    params = update(sys.argv[1], dist)
    if dist.is_main:
        torch.save(params, sys.argv[2])
    dist.barrier()
