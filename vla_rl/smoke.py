"""``--smoke true``: run any training preset on a CPU in a couple of minutes.

Full-size presets in ``configs/`` carry the GPU settings (hundreds of envs,
hub checkpoints, thousands of iterations). ``--smoke true`` keeps everything
that makes the preset what it is (env id, policy type, sampler kind and mode,
algorithm, log-prob level, critic placement, warmup...) and shrinks the rest.
This module is the only place that knows what "small" means:

- sizes are *capped*, never raised: ``num_envs <= 2``, ``iterations <= 2``,
  ``max_episode_steps <= 8``, ``decisions_per_iter`` just enough for one
  episode, one epoch,
  ``group_size <= 2``, two eval episodes, no video, no wandb / TensorBoard;
  a value given on the command line below a cap is kept;
- envs run in this process (``num_workers 0``) with 32 px images, or in state
  mode for policies that need no camera (:data:`SMOKE_POLICIES`);
- the policy is a tiny one: config-built policies get small widths
  (``compact-flow``; ``openvla-style`` gets the offline ``tiny-llava``
  backbone), and policies whose weights come from a hub checkpoint (``pi0``,
  ``pi05``, ``smolvla``) are replaced by random tiny LeRobot models built
  offline with :func:`policies.flow.tiny.build_tiny_lerobot_policy`, sized for
  the env (:func:`build_smoke_policy`).

The trainer calls :func:`apply_smoke` on its config and, when ``cfg.smoke``,
:func:`build_smoke_policy` before the registry's own constructor; neither
branches on the model type outside the :data:`SMOKE_POLICIES` table.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from policies.base import Policy
from sim.core import OBS_STATE, EnvSpec

if TYPE_CHECKING:
    from vla_rl.train_config import TrainConfig

MAX_ENVS = 2
MAX_ITERATIONS = 2
MAX_EPISODE_STEPS = 8
MAX_DECISIONS = 2
MAX_GROUP = 2
MAX_CHUNK = 4
MAX_DENOISE_STEPS = 2
IMAGE_SIZE = 32
EVAL_EPISODES = 2

Builder = Callable[[dict[str, Any], EnvSpec], Policy]
"""``(policy config options, env spec) -> tiny policy``."""


@dataclass(frozen=True)
class SmokePolicy:
    """How one registered policy type shrinks for a smoke run.

    Attributes:
        obs_mode: env observation mode in smoke runs (``state`` when the policy reads no camera).
        caps: config fields capped at these values (``min(value, cap)``).
        sets: config fields set to these values (architecture widths, offline backbones).
        builder: builds the tiny policy from the (shrunk) config options and the env spec instead of
            the registry's constructor (for policies whose weights come from a hub checkpoint).
    """

    obs_mode: str = "rgb"
    caps: dict[str, int] = field(default_factory=dict)
    sets: dict[str, Any] = field(default_factory=dict)
    builder: Builder | None = None


def _tiny_lerobot(kind: str) -> Builder:
    def build(options: dict[str, Any], spec: EnvSpec) -> Policy:
        from policies.flow.tiny import build_tiny_lerobot_policy
        from policies.registry import POLICIES

        if not spec.cameras:
            raise ValueError(f"smoke {kind}: the env has no camera; {kind} needs images (obs_mode rgb)")
        state_dim = spec.observation[OBS_STATE].shape[0]
        max_dim = max(8, state_dim, spec.action_dim)
        adapter = POLICIES.get(kind).config(**{**options, "pretrained": ""})
        folder = tempfile.mkdtemp(prefix=f"vla-rl-smoke-{kind}-") if kind == "smolvla" else None
        return build_tiny_lerobot_policy(
            kind, adapter, cameras=tuple(spec.cameras), image_size=spec.observation[spec.image_keys[0]].shape[0],
            state_dim=state_dim, action_dim=spec.action_dim, chunk_size=MAX_CHUNK, max_dim=max_dim, vlm_folder=folder,
        )

    return build


_LEROBOT = {"value_hidden": 32, "noise_hidden": 16}
SMOKE_POLICIES: dict[str, SmokePolicy] = {
    "compact-flow": SmokePolicy(
        obs_mode="state",
        caps={"chunk_size": MAX_CHUNK},
        sets={"width": 32, "heads": 2, "prefix_layers": 1, "expert_layers": 1, "cnn_channels": (8, 16),
              "image_tokens": 2, "text_encoder": "hashed", "text_buckets": 256, "value_hidden": 32,
              "noise_hidden": 16},
    ),
    "openvla-style": SmokePolicy(
        caps={"chunk_size": 1},
        sets={"backbone": "tiny-llava", "trust_remote_code": False, "dtype": "float32", "value_hidden_dim": 32,
              "unnorm_key": None},
    ),
    "pi0": SmokePolicy(sets=_LEROBOT, builder=_tiny_lerobot("pi0")),
    "pi05": SmokePolicy(sets=_LEROBOT, builder=_tiny_lerobot("pi05")),
    "smolvla": SmokePolicy(sets=_LEROBOT, builder=_tiny_lerobot("smolvla")),
}
"""Registry name -> how it shrinks. A policy type missing here keeps its own config (only sizes of
env, algorithm and evaluation shrink)."""


def _cap(value: int, cap: int) -> int:
    return min(value, cap) if value > 0 else cap


def _shrink_policy(policy: Any, rule: SmokePolicy) -> Any:
    names = {f.name for f in dataclasses.fields(policy)}
    changes: dict[str, Any] = {k: v for k, v in rule.sets.items() if k in names}
    changes.update({k: _cap(getattr(policy, k), c) for k, c in rule.caps.items() if k in names})
    if "sampler" in names:
        changes["sampler"] = replace(policy.sampler, num_steps=min(policy.sampler.num_steps, MAX_DENOISE_STEPS))
    return replace(policy, **changes)


def apply_smoke(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` shrunk for a CPU smoke run (see module doc); ``cfg`` itself when ``cfg.smoke`` is False.

    Raises:
        ValueError: from the configs' own validation, naming the field.
    """
    if not cfg.smoke:
        return cfg
    from vla_rl.train_config import policy_type

    rule = SMOKE_POLICIES.get(policy_type(cfg.policy), SmokePolicy(obs_mode=cfg.env.obs_mode))
    grpo_groups = cfg.algo.name == "grpo"
    group = min(cfg.algo.group_size, MAX_GROUP)
    num_envs = group if grpo_groups else min(cfg.env.num_envs, MAX_ENVS)
    env = replace(
        cfg.env, num_envs=num_envs, num_workers=0, obs_mode=rule.obs_mode,
        image_size=min(cfg.env.image_size or IMAGE_SIZE, IMAGE_SIZE),
        max_episode_steps=_cap(cfg.env.max_episode_steps, MAX_EPISODE_STEPS),
    )
    policy = _shrink_policy(cfg.policy, rule)
    chunk = getattr(policy, "chunk_size", MAX_CHUNK)  # tiny hub-checkpoint stand-ins act in MAX_CHUNK chunks
    exec_steps = min(cfg.exec_steps, chunk, MAX_CHUNK)
    # Every iteration must hold a whole episode (the trainer resets the envs each iteration).
    decisions = max(min(cfg.algo.decisions_per_iter, MAX_DECISIONS),
                    math.ceil(env.max_episode_steps / (exec_steps or chunk)))
    algo = replace(
        cfg.algo, decisions_per_iter=decisions, epochs=1, minibatch_size=min(cfg.algo.minibatch_size, 4),
        grad_accum_steps=1, group_size=group,
    )
    evals = replace(cfg.eval, episodes=min(cfg.eval.episodes, EVAL_EPISODES), num_envs=MAX_ENVS, every=0, video=False)
    logging = replace(cfg.logging, wandb=False, tensorboard=False)
    return replace(cfg, env=env, algo=algo, eval=evals, logging=logging, policy=policy,
                   iterations=min(cfg.iterations, MAX_ITERATIONS), exec_steps=exec_steps, checkpoint_every=1)


def build_smoke_policy(policy_type: str, options: dict[str, Any], spec: EnvSpec) -> Policy | None:
    """The tiny stand-in for ``policy_type`` when its table entry has a builder, else None."""
    rule = SMOKE_POLICIES.get(policy_type)
    if rule is None or rule.builder is None:
        return None
    return rule.builder(options, spec)
