"""Typed configs shared by every command (parsed by draccus).

Each command has one top config (``RolloutConfig``, ``CollectConfig``, ...);
nested configs hold the env, the policy and the algorithm. Presets are YAML
files in ``configs/`` (``--preset NAME`` or ``--config_path FILE``); any field
can be overridden on the command line (``--env.num_envs 4``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from sim import VecEnv, WristCamera, backends_with_wrist_camera, make_env, wrist_camera_support
from vla_rl.curriculum import TaskSamplingConfig


class ConfigError(ValueError):
    """A config value that cannot work, found once the env or policy is known; names the field."""


@dataclass
class EnvConfig:
    """Which simulator task to run and how."""

    id: str = "mujoco/multi"
    """Env id ``<backend>/<task>``; ``vla-rl envs`` lists them."""
    num_envs: int = 4
    """Envs stepped together."""
    seed: int = 0
    """Base seed: env i starts from seed + i."""
    obs_mode: str = "rgb"
    """``rgb`` (cameras + state) or ``state`` (no rendering)."""
    image_size: int = 0
    """Camera height/width in pixels; 0 = the backend's default."""
    max_episode_steps: int = 0
    """Steps before truncation; 0 = the task's default."""
    num_workers: int = -1
    """Worker processes; -1 = the backend's default, 0 = in this process."""
    control_mode: str = ""
    """Controller name; empty = the backend's default (end-effector delta pose)."""
    wrist_camera: bool = False
    """Also emit ``observation.images.wrist``: for backends with an optional wrist camera; ignored by those
    that always render one; others reject it (``sim.wrist_camera_support``)."""
    spin_wait: str = "auto"
    """With env workers, busy-poll for replies instead of sleeping: ``on``, ``off``, ``auto`` (if they fit the CPUs)."""
    executor: str = "process"
    """What runs the env workers: ``process`` (worker processes) or ``ray`` (Ray actors, local or on the cluster of
    ``RAY_ADDRESS``; needs ``num_workers >= 1`` and the ``ray`` extra). Same episodes for the same seeds."""
    tasks: TaskSamplingConfig = field(default_factory=TaskSamplingConfig)
    """Multi-task envs: which task each training reset plays (``--env.tasks.sampler
    uniform|curriculum|progress|balanced``) and which tasks are held out for evaluation (``--env.tasks.holdout
    '[a, b]'``); see :mod:`vla_rl.curriculum`."""

    def has_optional_wrist_camera(self) -> bool:
        """Whether the backend of ``id`` has a wrist camera that ``wrist_camera`` switches on."""
        return wrist_camera_support(self.id) is WristCamera.OPTIONAL

    def with_policy_cameras(self, cameras: Sequence[str] | None, policy: str) -> EnvConfig:
        """This config with the optional wrist camera turned on (and a note printed) when the policy ``policy``
        reads a ``wrist`` camera this env would otherwise not render; else unchanged."""
        if cameras and "wrist" in cameras and not self.wrist_camera and self.has_optional_wrist_camera():
            print(f"note: {policy} reads a wrist camera; turning on env.wrist_camera for {self.id}")
            return replace(self, wrist_camera=True)
        return self

    def make(self, num_envs: int | None = None, seed: int | None = None) -> VecEnv:
        """Build the env (``num_envs`` / ``seed`` override the config's)."""
        options = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("id", "num_envs", "seed", "tasks")}
        support = wrist_camera_support(self.id)
        if not self.wrist_camera or support is WristCamera.ALWAYS:  # no switch to pass when it always renders
            options.pop("wrist_camera")
        elif support is not WristCamera.OPTIONAL:
            optional = ", ".join(f"{b}/*" for b in backends_with_wrist_camera(WristCamera.OPTIONAL))
            always = ", ".join(f"{b}/*" for b in backends_with_wrist_camera(WristCamera.ALWAYS))
            raise ConfigError(f"env.wrist_camera: {self.id} has no optional wrist camera (these have: {optional}; "
                              f"these always render one: {always or 'none'})")
        if self.tasks.train_init_states:  # a backend option of the envs with fixed init states (LIBERO suites)
            options["train_init_states"] = self.tasks.train_init_states
        return make_env(
            self.id, num_envs=self.num_envs if num_envs is None else num_envs,
            seed=self.seed if seed is None else seed, **options,
        )


def plain_values(encoded: Any) -> Any:
    """``draccus.encode`` output as plain JSON / YAML values (enums as their values, tuples as lists), as checkpoints
    save a config."""
    return json.loads(json.dumps(encoded))


def default_runs_dir() -> Path:
    """``$VLA_RL_RUNS`` or ``runs/`` under the working directory."""
    return Path(os.environ.get("VLA_RL_RUNS", "runs"))


@dataclass
class RolloutConfig:
    """``vla-rl rollout``: run a policy in an env, report success, optionally record video."""

    env: EnvConfig = field(default_factory=EnvConfig)
    policy: str = "random"
    """``random``, ``expert`` (the task's scripted expert) or a policy checkpoint folder."""
    episodes: int = 4
    """Episodes to finish before stopping (counted over all envs)."""
    video: bool = False
    """Write ``rollout.mp4`` of the cameras."""
    output_dir: str = ""
    """Where videos and the summary go; empty = ``runs/rollout-<env>``."""


@dataclass
class CollectConfig:
    """``vla-rl collect``: record scripted-expert episodes as a LeRobotDataset v3."""

    env: EnvConfig = field(default_factory=EnvConfig)
    episodes: int = 20
    """Episodes to record."""
    output: str = ""
    """Dataset folder; empty = ``data/<env id>-expert-s<seed>``. Must not exist."""
    repo_id: str = "local/vla-rl-demos"
    """Dataset name in its metadata (nothing is uploaded)."""
    only_success: bool = True
    """Keep only episodes the expert finished successfully."""
    max_attempts: int = 0
    """Stop after this many episodes even if fewer succeeded; 0 = 3 x episodes."""
    action_noise: float = 0.0
    """DART-style noise injection: execute the expert action plus N(0, std^2) (clipped to the action
    bounds) but record the clean expert action, so demos show how to recover from small errors."""
