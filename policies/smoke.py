"""Tiny CPU variants of the registered policies, for ``--smoke true`` runs and tests.

Each policy module registers how its policy type shrinks, next to the policy
itself::

    SMOKE_VARIANTS.register("compact-flow")(SmokeVariant(obs_mode="state", sets={"width": 32, ...}))

so the training package never names a policy type. A policy type with no
variant keeps its own config in smoke runs (only env, algorithm and evaluation
sizes shrink).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from policies.base import Policy
from vla_core.registry import Registry

MAX_CHUNK = 4
"""Action chunk of the tiny variants at most (the hub-checkpoint stand-ins act in chunks of exactly this)."""
MAX_DENOISE_STEPS = 2
"""Denoising steps of a tiny flow policy's sampler at most."""

Builder = Callable[[Any, dict[str, Any]], Policy]
"""``(shrunk policy config, env-derived fields) -> tiny policy``. The fields are those of
:func:`vla_rl.policy_factory.spec_fields`: ``action_dim``, ``cameras``, ``state_dim``, ``image_size``..."""


@dataclass(frozen=True)
class SmokeVariant:
    """How one registered policy type shrinks for a smoke run.

    Attributes:
        obs_mode: env observation mode in smoke runs (``state`` when the policy reads no camera).
        caps: config fields capped at these values (``min(value, cap)``; a value <= 0 becomes the cap).
        sets: config fields set to these values (architecture widths, offline backbones).
        builder: builds the tiny policy from the shrunk config and the env-derived fields instead of the
            registry's constructor (for policies whose weights come from a hub checkpoint).
    """

    obs_mode: str = "rgb"
    caps: dict[str, int] = field(default_factory=dict)
    sets: dict[str, Any] = field(default_factory=dict)
    builder: Builder | None = None

    def shrink(self, config: Any) -> Any:
        """``config`` with :attr:`sets` applied, :attr:`caps` enforced (:func:`cap`), and a flow ``sampler``'s
        denoising steps capped at :data:`MAX_DENOISE_STEPS`."""
        names = {f.name for f in dataclasses.fields(config)}
        changes: dict[str, Any] = {k: v for k, v in self.sets.items() if k in names}
        changes.update({k: cap(getattr(config, k), c) for k, c in self.caps.items() if k in names})
        if "sampler" in names:
            sampler = config.sampler
            changes["sampler"] = dataclasses.replace(sampler, num_steps=min(sampler.num_steps, MAX_DENOISE_STEPS))
        return dataclasses.replace(config, **changes)


def cap(value: int, limit: int) -> int:
    """``value`` capped at ``limit``; a value <= 0 ("the default", "unlimited") becomes ``limit``."""
    return min(value, limit) if value > 0 else limit


SMOKE_VARIANTS: Registry = Registry("policy smoke variant")
"""Policy type name -> :class:`SmokeVariant` (registered by each policy's module)."""
