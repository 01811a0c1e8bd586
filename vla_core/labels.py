"""RaC step labels shared by every layer that records intervention data (sim sessions, robot deployments).

See :mod:`vla_rl.intervention.labels` for the dataset fields and the ingestion rules.
"""

from __future__ import annotations

from enum import IntEnum

from vla_core.keys import INTERVENTION, INTERVENTION_LABEL


class Label(IntEnum):
    """Who controlled a step (the code stored in ``intervention_label``)."""

    POLICY = 0
    RECOVERY = 1
    CORRECTION = 2

    @property
    def text(self) -> str:
        """``policy``, ``recovery`` or ``correction``."""
        return self.name.lower()


LABEL_NAMES: tuple[str, ...] = tuple(label.text for label in Label)


def label_features() -> dict[str, dict]:
    """The LeRobot feature entries of the two per-frame fields (module doc)."""
    return {
        INTERVENTION: {"dtype": "bool", "shape": (1,), "names": None},
        INTERVENTION_LABEL: {"dtype": "int64", "shape": (1,), "names": ["policy=0,recovery=1,correction=2"]},
    }
