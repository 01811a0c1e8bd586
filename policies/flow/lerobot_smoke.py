"""Tiny variants of the LeRobot flow policies (pi0, pi0.5, SmolVLA) for ``--smoke true`` runs.

Their real weights come from hub checkpoints, which a CPU machine without a
network cannot fetch, so a smoke run builds a random tiny model of the same
architecture with LeRobot's own classes and processors
(:func:`policies.flow.tiny.build_tiny_lerobot_policy`), sized for the env.
"""

from __future__ import annotations

import tempfile
from typing import Any

from policies.base import Policy
from policies.flow.lerobot import LeRobotPI0Policy, LeRobotPI05Policy, LeRobotSmolVLAPolicy
from policies.smoke import MAX_CHUNK, SMOKE_VARIANTS, SmokeVariant


def _tiny(kind: str):
    def build(config: Any, fields: dict[str, Any]) -> Policy:
        from dataclasses import replace

        from policies.flow.tiny import build_tiny_lerobot_policy

        cameras = tuple(fields.get("cameras") or ())
        if not cameras:
            raise ValueError(f"smoke {kind}: the env has no camera; {kind} needs images (obs_mode rgb)")
        state_dim = int(fields.get("state_dim", 0))
        action_dim = int(fields["action_dim"])
        folder = tempfile.mkdtemp(prefix=f"vla-rl-smoke-{kind}-") if kind == "smolvla" else None
        return build_tiny_lerobot_policy(
            kind, replace(config, pretrained=""), cameras=cameras, image_size=fields["image_size"][0],
            state_dim=state_dim, action_dim=action_dim, chunk_size=MAX_CHUNK,
            max_dim=max(8, state_dim, action_dim), vlm_folder=folder,
        )

    return build


for _cls in (LeRobotPI0Policy, LeRobotPI05Policy, LeRobotSmolVLAPolicy):
    SMOKE_VARIANTS.register(_cls.NAME)(SmokeVariant(sets={"value_hidden": 32, "noise_hidden": 16},
                                                    builder=_tiny(_cls.NAME)))
