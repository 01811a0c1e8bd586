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

    def shrink(self, config: Any, max_chunk: int, max_denoise_steps: int) -> Any:
        """``config`` with :attr:`sets` applied, :attr:`caps` (and ``chunk_size`` to ``max_chunk`` where capped)
        enforced, and a flow ``sampler``'s denoising steps capped at ``max_denoise_steps``."""
        names = {f.name for f in dataclasses.fields(config)}
        changes: dict[str, Any] = {k: v for k, v in self.sets.items() if k in names}
        changes.update({k: _cap(getattr(config, k), min(c, max_chunk) if k == "chunk_size" else c)
                        for k, c in self.caps.items() if k in names})
        if "sampler" in names:
            sampler = config.sampler
            changes["sampler"] = dataclasses.replace(sampler, num_steps=min(sampler.num_steps, max_denoise_steps))
        return dataclasses.replace(config, **changes)


def _cap(value: int, cap: int) -> int:
    return min(value, cap) if value > 0 else cap


SMOKE_VARIANTS: Registry = Registry("policy smoke variant")
"""Policy type name -> :class:`SmokeVariant` (registered by each policy's module)."""
