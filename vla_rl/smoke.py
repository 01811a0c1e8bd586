"""``--smoke true``: run any training preset on a CPU in a couple of minutes.

Full-size presets in ``configs/`` carry the GPU settings (hundreds of envs,
hub checkpoints, thousands of iterations). ``--smoke true`` keeps everything
that makes the preset what it is (env id, policy type, sampler kind and mode,
algorithm, log-prob level, critic placement, warmup...) and shrinks the rest.
This module says what "small" means for the run (the policy's own sizes, chunk
and denoising steps are :mod:`policies.smoke`'s):

- sizes are *capped*, never raised: ``num_envs <= 2``, ``iterations <= 2``,
  ``max_episode_steps <= 8``, ``decisions_per_iter`` just enough for one
  episode, one epoch,
  ``group_size <= 2``, two eval episodes (one per task under ``eval.protocol per_task``), no video, no wandb / TensorBoard;
  a value given on the command line below a cap is kept;
- envs run in this process (``num_workers 0``) with 32 px images, or in state
  mode for policies that need no camera;
- the policy is the tiny variant its own module registers in
  :data:`policies.smoke.SMOKE_VARIANTS` (small widths, offline backbones, or a
  random tiny model of a hub checkpoint's architecture, built by
  :func:`vla_rl.policy_factory.build_policy` when ``cfg.smoke``);
- the algorithm shrinks itself (:meth:`vla_rl.algorithms.base.LearnerConfig.smoke`).

``vla-rl train`` calls :func:`apply_smoke` on its config; nothing here names a
policy type or an algorithm.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from policies.smoke import MAX_CHUNK, SMOKE_VARIANTS, SmokeVariant, cap
from vla_rl.algorithms.base import SmokeLimits

if TYPE_CHECKING:
    from vla_rl.train_config import TrainConfig

MAX_ENVS = 2
MAX_ITERATIONS = 2
MAX_EPISODE_STEPS = 8
MAX_DECISIONS = 2
MAX_GROUP = 2
IMAGE_SIZE = 32
EVAL_EPISODES = 2


def apply_smoke(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` shrunk for a CPU smoke run (see module doc); ``cfg`` itself when ``cfg.smoke`` is False.

    Raises:
        ValueError: from the configs' own validation, naming the field.
    """
    if not cfg.smoke:
        return cfg
    from vla_rl.train_config import policy_type

    name = policy_type(cfg.policy)
    rule = SMOKE_VARIANTS.get(name).obj if name in SMOKE_VARIANTS else SmokeVariant(obs_mode=cfg.env.obs_mode)
    max_episode_steps = cap(cfg.env.max_episode_steps, MAX_EPISODE_STEPS)
    policy = rule.shrink(cfg.policy)
    chunk = getattr(policy, "chunk_size", MAX_CHUNK)  # tiny hub-checkpoint stand-ins act in MAX_CHUNK chunks
    exec_steps = min(cfg.exec_steps, chunk, MAX_CHUNK)
    # Every iteration must hold a whole episode (the trainer resets the envs each iteration).
    limits = SmokeLimits(max_envs=MAX_ENVS, max_decisions=MAX_DECISIONS, max_group=MAX_GROUP, max_minibatch=4,
                         episode_decisions=math.ceil(max_episode_steps / (exec_steps or chunk)))
    algo, num_envs = cfg.algo.smoke(limits, cfg.env.num_envs)
    env = replace(
        cfg.env, num_envs=num_envs, num_workers=0,
        obs_mode=rule.obs_mode, image_size=min(cfg.env.image_size or IMAGE_SIZE, IMAGE_SIZE),
        max_episode_steps=max_episode_steps,
    )
    evals = replace(cfg.eval, episodes=min(cfg.eval.episodes, EVAL_EPISODES), num_envs=MAX_ENVS, every=0, video=False,
                    episodes_per_task=1)
    logging = replace(cfg.logging, wandb=False, tensorboard=False)
    return replace(cfg, env=env, algo=algo, eval=evals, logging=logging, policy=policy,
                   iterations=min(cfg.iterations, MAX_ITERATIONS), exec_steps=exec_steps, checkpoint_every=1)

