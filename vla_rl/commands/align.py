"""``vla-rl align``: GRAPE preference alignment in rounds (:mod:`vla_rl.grape.rounds`).

    vla-rl align --preset align_task --policy.path runs/quickstart-mujoco-pick-any-s0/sft_policy
    vla-rl align --preset align_safety --policy.path ... --grape.score.costs '{collision: 2.0}'
"""

from __future__ import annotations

from typing import Any

import torch

from vla_rl.commands import COMMANDS
from vla_rl.grape.rounds import AlignConfig, run_align


@COMMANDS.register("align", config=AlignConfig, help="GRAPE preference alignment: sample, score, pair, TPO, evaluate")
def align(cfg: AlignConfig) -> dict[str, Any]:
    torch.set_num_threads(1)
    return run_align(cfg)
