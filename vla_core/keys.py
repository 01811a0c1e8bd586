"""Observation, action and dataset keys shared by every layer (LeRobot's names).

An observation is a dict of batched tensors: ``observation.images.<camera>``
(``uint8 [B, H, W, 3]``), ``observation.state`` (``float32 [B, S]``), optionally
``observation.env_state`` (``float32 [B, P]``, privileged simulator state) and
``task`` (a list of ``B`` instructions). Datasets add ``action`` and the
per-frame ``next.reward`` / ``next.success`` / ``intervention`` fields.
"""

from __future__ import annotations

OBS_IMAGE_PREFIX = "observation.images."
OBS_STATE = "observation.state"
OBS_ENV_STATE = "observation.env_state"
TASK = "task"
ACTION = "action"
REWARD = "next.reward"
SUCCESS = "next.success"
DONE = "next.done"
INTERVENTION = "intervention"
"""LeRobot's human-in-the-loop dataset field (``bool [1]``, what ``lerobot-rollout``'s DAgger strategy records):
True where a teleoperator's action replaced the policy's."""
LEGACY_INTERVENTION = "is_intervention"
"""The same flag under LeRobot's teleop-event name (``TeleopEvents.IS_INTERVENTION``), which earlier
vla-rl deployments recorded; read as ``intervention``."""
INTERVENTION_LABEL = "intervention_label"
"""RaC step label (``int64 [1]``): 0 policy, 1 recovery, 2 correction (:mod:`vla_rl.intervention.labels`)."""


def image_key(camera: str) -> str:
    """The observation key of camera ``camera``."""
    return OBS_IMAGE_PREFIX + camera
