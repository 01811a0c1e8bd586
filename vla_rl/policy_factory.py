"""Build the policy a run trains: fresh from a registered config sized for the env, or from a checkpoint.

Nothing here names a policy type: the registry (:data:`policies.registry.POLICIES`)
gives the class and its config, the env spec gives the sizes (:func:`spec_fields`),
and a smoke run takes the tiny variant the policy's module registered
(:data:`policies.smoke.SMOKE_VARIANTS`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import draccus

from policies.base import Policy
from policies.io import checkpoint_config
from policies.loading import load_policy
from policies.registry import POLICIES
from policies.smoke import SMOKE_VARIANTS
from sim.core import OBS_ENV_STATE, OBS_STATE, EnvSpec
from vla_rl.config import plain_values


def spec_fields(spec: EnvSpec) -> dict[str, Any]:
    """Policy config values derived from an env spec (by the conventional field names)."""
    out: dict[str, Any] = {"action_dim": spec.action_dim, "cameras": tuple(spec.cameras)}
    if OBS_STATE in spec.observation:
        out["state_dim"] = spec.observation[OBS_STATE].shape[0]
    if OBS_ENV_STATE in spec.observation:
        out["env_state_dim"] = spec.observation[OBS_ENV_STATE].shape[0]
    if spec.image_keys:
        out["image_size"] = tuple(spec.observation[spec.image_keys[0]].shape[:2])
    return out


def build_policy_from_fields(name: str, options: dict[str, Any], derived: dict[str, Any], smoke: bool = False) -> Policy:
    """A fresh policy of registered type ``name`` with config ``options``, sized by ``derived`` (:func:`spec_fields`).

    An explicit ``cameras`` selection among the derived ones is kept; the config's default means "all of them".
    With ``smoke``, a policy type whose tiny variant has a builder (hub checkpoints) is built by it.
    """
    entry = POLICIES.get(name)
    names = {f.name for f in dataclasses.fields(entry.config)}
    derived = dict(derived)
    chosen = options.get("cameras")
    default = next((f.default for f in dataclasses.fields(entry.config) if f.name == "cameras"), None)
    if chosen is not None and tuple(chosen) != default and set(chosen) <= set(derived.get("cameras", ())):
        derived["cameras"] = tuple(chosen)
    variant = SMOKE_VARIANTS.get(name).obj if smoke and name in SMOKE_VARIANTS else None
    if variant is not None and variant.builder is not None:
        return variant.builder(entry.config(**options), derived)
    options = {**options, **{k: v for k, v in derived.items() if k in names}}
    return entry.obj(entry.config(**options))


def build_policy(policy: Any, spec: EnvSpec, smoke: bool = False) -> Policy:
    """A fresh policy sized for ``spec``, or the checkpoint at ``policy.path`` (with ``policy.sampler``, which
    ``vla-rl train`` starts from the checkpoint's).

    Args:
        policy: a :class:`vla_rl.train_config.PolicyConfig` choice (``--policy.*``).
        spec: the env's spec (or a dataset's, :meth:`vla_rl.data.DatasetSpec.env_spec`).
        smoke: build the policy type's tiny variant where it has a builder (``--smoke true``).

    The policy is placed on :func:`vla_rl.distributed.default_device` (the GPU when there is one).
    """
    from vla_rl.distributed import default_device
    from vla_rl.train_config import policy_options, policy_type

    options = policy_options(policy)
    if policy.path:
        # the sampler applies to a checkpoint that has one (not to, e.g., a gaussian-mlp one loaded without
        # --policy.type, whose options are then the default flow policy's)
        saved = checkpoint_config(policy.path)
        overrides = {"sampler": options["sampler"]} if "sampler" in options and "sampler" in saved else {}
        note_sampler_change(policy.path, overrides.get("sampler"))
        loaded = load_policy(policy.path, **overrides)  # a damaged or missing checkpoint is reported first
        check_checkpoint_options(policy.path, policy_type(policy), options, saved)
        return loaded.to(default_device())
    return build_policy_from_fields(policy_type(policy), options, spec_fields(spec), smoke=smoke).to(default_device())


def check_checkpoint_options(path: str, name: str, options: dict[str, Any], saved: dict[str, Any]) -> None:
    """Refuse policy fields set for a run that loads ``path``, which loading would silently ignore.

    A checkpoint loads as it was saved: only ``policy.sampler`` applies to it. A field of the ``name`` type's config
    (other than ``sampler`` and the sizes taken from the env) whose value here is neither the type's default (so it
    was set by the command line or a preset) nor the checkpoint's saved value would be dropped without a word (for
    example ``--policy.value_placement state`` with ``--policy.path``); that is an error naming each such field.
    ``saved`` is the checkpoint's ``config.json`` (:func:`policies.io.checkpoint_config`).

    Raises:
        ConfigError: naming the fields, both values and what to do instead.
    """
    from vla_rl.config import ConfigError

    entry = POLICIES.get(name)
    if saved.get("type", name) != name:
        return  # another type's checkpoint (loaded by its own type): this type's defaults were never the user's
    default = _plain(entry.config())
    ours = _plain(entry.config(**options)) if options else default
    sized = {"action_dim", "state_dim", "env_state_dim", "cameras", "image_size", "sampler"}
    ignored = [f"--policy.{k} {ours[k]!r} (checkpoint: {saved[k]!r})" for k in ours
               if k not in sized and k in saved and ours[k] != default.get(k) and ours[k] != saved[k]]
    if ignored:
        raise ConfigError(
            f"policy.path {path}: a checkpoint loads as it was saved (only policy.sampler applies), so "
            f"{', '.join(ignored)} would be ignored; drop the option, or build a policy with it and load the "
            "checkpoint's weights into it by hand")


def _plain(config: Any) -> dict[str, Any]:
    """A (policy or sampler) config as checkpoints save it."""
    return plain_values(draccus.encode(config))


def note_sampler_change(path: str, sampler: Any) -> None:
    """Say so when a run samples ``path`` with another sampler than the one saved with it.

    ``vla-rl train`` starts ``policy.sampler`` from the checkpoint's (see ``vla_rl.cli``), so this happens when
    the command line or preset changes it, or when a config built in code does not start from it.
    """
    if sampler is None:
        return
    saved = checkpoint_config(path).get("sampler")
    mine = _plain(sampler)
    if not isinstance(saved, dict):
        return
    # fields the checkpoint predates are not a change (a sampler field added since it was saved)
    changed = ", ".join(f"{k}={saved[k]!r} -> {v!r}" for k, v in mine.items() if k in saved and saved[k] != v)
    if changed:
        print(f"note: policy.path {path}: sampling with another policy.sampler than the checkpoint was saved "
              f"with ({changed})", flush=True)
