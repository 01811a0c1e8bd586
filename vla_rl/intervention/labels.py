"""Step labels of intervention data (RaC) and how they are stored in a LeRobotDataset.

Every step of an intervention episode is one of:

- ``policy`` (0): the policy acted;
- ``recovery`` (1): the operator drove the robot back toward a familiar state seen earlier;
- ``correction`` (2): the operator completed the current sub-task.

A dataset stores two per-frame features:

- ``intervention`` ``bool [1]``: LeRobot's own human-in-the-loop field (the one
  ``lerobot-rollout --strategy.type dagger`` records): True on every
  ``recovery`` or ``correction`` step. LeRobot tools read it unchanged.
- ``intervention_label`` ``int64 [1]``: the label code above (ours; LeRobot
  tools ignore an extra feature).

Datasets recorded by LeRobot carry only ``intervention`` (or, from older
vla-rl recordings, ``is_intervention``); :func:`labels_from_flags` turns such
flags into labels by a documented rule.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vla_core.keys import INTERVENTION, INTERVENTION_LABEL, LEGACY_INTERVENTION
from vla_core.labels import LABEL_NAMES, Label, label_features

__all__ = ["INTERVENTION", "INTERVENTION_LABEL", "LABEL_NAMES", "LEGACY_INTERVENTION", "Label", "SPLIT_RULES",
           "label_features", "labels_from_flags"]


SPLIT_RULES = ("correction", "first-k", "retreat")
"""How unlabelled intervention steps are split (:func:`labels_from_flags`)."""


def labels_from_flags(flags: Tensor, episode_index: Tensor, rule: str = "correction", recovery_steps: int = 5,
                      pinch_z: Tensor | None = None) -> Tensor:
    """Labels ``int64 [N]`` for frames that carry only an intervention flag (LeRobot's ``intervention``).

    Non-intervention frames are ``policy``. Each run of consecutive intervention frames in one episode is a
    takeover, labelled by ``rule``:

    - ``correction`` (default): every step of the takeover is ``correction`` (the operator's steps are
      treated as expert data, as DAgger does);
    - ``first-k``: the first ``recovery_steps`` steps of each takeover are ``recovery``, the rest
      ``correction`` (an operator typically backs off before completing the sub-task);
    - ``retreat``: the leading steps of each takeover during which the end effector rises (``pinch_z``
      ``float [N]``, the height of the end effector, increases from step to step) are ``recovery``, the
      rest ``correction``: RaC's recovery backs away from the failure, which on a tabletop is upward.

    Args:
        flags: bool ``[N]``; frames stored episode after episode, in time order.
        episode_index: int ``[N]``.

    Raises:
        ValueError: for an unknown rule, ``retreat`` without ``pinch_z``, or mismatched lengths.
    """
    if rule not in SPLIT_RULES:
        raise ValueError(f"intervention split rule must be one of {SPLIT_RULES}, got {rule!r}")
    if rule == "retreat" and pinch_z is None:
        raise ValueError("intervention split rule 'retreat' needs the end-effector height (observation.state[2])")
    n = flags.shape[0]
    if episode_index.shape[0] != n or (pinch_z is not None and pinch_z.shape[0] != n):
        raise ValueError(f"labels_from_flags: {n} flags but {episode_index.shape[0]} episode indices")
    flags = flags.bool().reshape(-1)
    labels = torch.where(flags, int(Label.CORRECTION), int(Label.POLICY)).long()
    if rule == "correction":
        return labels
    k = 0
    for i in range(n):
        start = flags[i] and (i == 0 or not flags[i - 1] or episode_index[i] != episode_index[i - 1])
        k = 0 if start else k + 1
        if not flags[i]:
            continue
        if rule == "first-k":
            recovering = k < recovery_steps
        else:
            assert pinch_z is not None
            rising = i + 1 < n and flags[i + 1] and episode_index[i + 1] == episode_index[i] and pinch_z[i + 1] > pinch_z[i]
            recovering = rising and (k == 0 or labels[i - 1] == Label.RECOVERY)
        if recovering:
            labels[i] = int(Label.RECOVERY)
    return labels
