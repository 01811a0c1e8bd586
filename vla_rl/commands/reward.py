"""``vla-rl reward train | eval | reweigh``: learned rewards and reward weights.

- ``train``: fit a success classifier (``--kind classifier``) or a process reward model (``--kind progress``)
  on labelled episodes, recorded from an env (``--source.policy expert|random|<policy folder>``, with
  per-env action noise to get failures) or read from a LeRobotDataset (``--source.dataset DIR``); report
  held-out metrics; write the model folder (``vla-rl train --reward.classifier.path`` / ``--reward.prm.path``).
  Between RL phases, retrain the process reward model on the phase's policy: ``--source.policy
  <run>/checkpoints/best/policy``; ``--also.*`` adds a second source's episodes (the expert's plus a policy's).
- ``eval``: a trained model's metrics on other episodes (e.g. 400 fresh ones).
- ``reweigh``: recompute a run's advantages and returns with other term weights from its stored reward
  terms, without new rollouts (:mod:`vla_rl.reweigh`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rewards.learned.train import FitConfig
from vla_rl.commands import command_group
from vla_rl.config import ConfigError, EnvConfig, default_runs_dir
from vla_rl.distributed import default_device

SOURCE_POLICIES = ("expert", "random")


@dataclass
class EpisodeSourceConfig:
    """Where labelled episodes come from: a LeRobotDataset, or an env played by an actor."""

    dataset: str = ""
    """LeRobotDataset folder (``vla-rl collect``, or a user's with ``next.success`` / ``next.reward``); empty =
    record episodes from ``env`` instead."""
    policy: str = "expert"
    """Recording: ``expert`` (the task's scripted expert), ``random`` or a policy checkpoint folder."""
    episodes: int = 200
    """Episodes to record (or to read from the dataset; 0 there = all)."""
    action_noise: list[float] = field(default_factory=lambda: [0.0, 0.5, 1.0, 2.0])
    """Recording the expert: Gaussian noise std added to its actions, per env cycling through this list, so
    the episodes include failures and near misses (a classifier needs both outcomes)."""
    seed: int = 0
    """Reset seed of the recording env and of the action noise (the expert's, or a policy's exploration)."""


@dataclass
class RewardTrainConfig:
    """``vla-rl reward train``: fit a success classifier or a process reward model on labelled episodes."""

    env: EnvConfig = field(default_factory=lambda: EnvConfig(id="mujoco/pick-red"))
    """The env to record from (and whose observations the model reads)."""
    source: EpisodeSourceConfig = field(default_factory=EpisodeSourceConfig)
    kind: str = "classifier"
    """``classifier`` (P(success), the ``classifier`` term) or ``progress`` (the ``prm`` term)."""
    labels: str = "stages"
    """``progress``: milestone labels, ``stages`` (stage predicates on privileged observations, MuJoCo
    tabletop) or ``events`` (gripper open/close and rest events of successful episodes; any data)."""
    also: EpisodeSourceConfig = field(default_factory=lambda: EpisodeSourceConfig(episodes=0, seed=5_000))
    """More episodes added to ``source``'s (off with ``episodes`` 0 and no ``dataset``): e.g. the expert's
    (``source``) plus the policy RL will start from exploring (``--also.policy <sft_policy> --also.episodes 200``),
    so the model has seen the states RL visits; a PRM trained on the expert alone over-scores them
    (docs/rewards.md). Its own reset seeds (default 5000), so its episodes start from other states."""
    fit: FitConfig = field(default_factory=FitConfig)
    """Training settings."""
    output: str = ""
    """Model folder; empty = ``runs/reward-<kind>-<env>``."""

    def __post_init__(self) -> None:
        from rewards.learned.labels import LABELS
        from rewards.learned.model import KINDS
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.labels not in LABELS:
            raise ValueError(f"labels must be one of {LABELS}, got {self.labels!r}")


@dataclass
class RewardEvalConfig:
    """``vla-rl reward eval``: a trained reward model's metrics on (new) labelled episodes."""

    path: str = ""
    """Reward model folder (``vla-rl reward train``)."""
    env: EnvConfig = field(default_factory=lambda: EnvConfig(id="mujoco/pick-red"))
    source: EpisodeSourceConfig = field(default_factory=lambda: EpisodeSourceConfig(seed=10_000))
    labels: str = "stages"
    """Progress models: the milestone labels to compare with (``stages`` or ``events``)."""
    threshold: float = 0.5
    """Classifiers: P(success) at or above which a frame counts as success."""
    output: str = ""
    """Write the metrics to this JSON file; empty = print only."""


@dataclass
class ReweighConfig:
    """``vla-rl reward reweigh``: a run's advantages under other term weights, from its stored reward terms."""

    run: str = ""
    """Run folder (holding ``reward_terms/iter_<k>.pt``, written by ``vla-rl train``)."""
    iteration: int = 0
    """Only this iteration's trace; 0 = every stored one."""
    terms: dict[str, float] = field(default_factory=dict)
    """The new weights, term -> weight (e.g. ``{success: 1.0, prm: 0.5}``); every term must have been stored."""
    output: str = ""
    """Write the comparison to this JSON file; empty = ``<run>/reweigh.json``."""


# ----------------------------------------------------------------------------- episodes


def _actor(name: str, env: Any, noise: list[float], seed: int) -> Any:
    """The chunk actor recording uses (see :class:`EpisodeSourceConfig`)."""
    if name == "expert":
        gen = torch.Generator().manual_seed(seed)
        std = torch.tensor([noise[i % len(noise)] if noise else 0.0 for i in range(env.num_envs)])[:, None]

        def expert(obs: Any) -> torch.Tensor:
            a = env.expert_actions().float()
            return (a + torch.randn(a.shape, generator=gen) * std).clamp(-1, 1)[:, None]
        return expert
    if name == "random":
        gen = torch.Generator().manual_seed(seed)
        return lambda obs: torch.rand((env.num_envs, 1, env.spec.action_dim), generator=gen) * 2 - 1
    from policies.base import ActMode
    from policies.loading import load_policy

    policy = load_policy(name).to(default_device())
    policy.eval()
    gen = torch.Generator().manual_seed(seed)  # its own stream: the episodes depend on the seed alone

    @torch.inference_mode()
    def explore(obs: Any) -> torch.Tensor:
        return policy.act(obs, ActMode.EXPLORE, generator=gen).actions
    return explore


def load_episodes(env_cfg: EnvConfig, source: EpisodeSourceConfig, keys: list[str] | None,
                  model: Any = None, name: str = "source") -> list[Any]:
    """The labelled episodes ``source`` (the config field ``name``) names (recorded from ``env_cfg`` or read from
    a dataset); with a reward ``model``, the env's (or the dataset's first episode's) observations are checked
    against its inputs first.

    Raises:
        ConfigError: for a policy that is neither ``expert``, ``random`` nor a folder, or a dataset that cannot
            be read or labelled (naming the folder and field).
    """
    from rewards.learned.data import EpisodeDataError, read_dataset_episodes, record_episodes

    if source.dataset:
        try:
            episodes = read_dataset_episodes(source.dataset, keys, source.episodes)
        except EpisodeDataError as exc:
            raise ConfigError(str(exc)) from None
        if model is not None:
            model.check_batch(episodes[0].obs, where=f"dataset {source.dataset}")
        return episodes
    if source.policy not in SOURCE_POLICIES and not Path(source.policy).is_dir():
        raise ConfigError(f"{name}.policy: {source.policy!r} is neither expert, random nor a policy folder")
    if source.episodes <= 0:
        raise ConfigError(f"{name}.episodes must be > 0 when recording, got {source.episodes}")
    env_cfg = with_source_cameras(env_cfg, source)
    with env_cfg.make(seed=source.seed) as env:
        if model is not None:
            model.check_inputs({k: v.shape for k, v in env.spec.observation.items()}, where=env_cfg.id)
        actor = _actor(source.policy, env, source.action_noise, source.seed)
        return record_episodes(env, actor, source.episodes, source.seed, keys, desc=f"record {env_cfg.id}")


def with_source_cameras(env_cfg: EnvConfig, source: EpisodeSourceConfig) -> EnvConfig:
    """``env_cfg`` with the cameras ``source``'s policy folder reads turned on (its wrist camera); unchanged for the
    expert, random actions or a path that is not a folder."""
    if source.policy in SOURCE_POLICIES or not Path(source.policy).is_dir():
        return env_cfg
    from policies.io import checkpoint_cameras

    return env_cfg.with_policy_cameras(checkpoint_cameras(source.policy), source.policy)


def same_observations(source: list[Any], also: list[Any]) -> None:
    """Raises ConfigError unless the two sources' episodes hold the same observation keys and frame shapes."""
    def shapes(episodes: list[Any]) -> dict[str, list[int]]:
        return {k: list(v.shape[1:]) for k, v in sorted(episodes[0].obs.items())} if episodes else {}

    a, b = shapes(source), shapes(also)
    if a and b and a != b:
        raise ConfigError(f"also: its episodes' observations {b} differ from source's {a}; record both with the same "
                          "cameras and image size (or read both from datasets recorded alike)")


def _targets(kind: str, labels: str, episodes: list[Any]) -> tuple[list[Any], list[torch.Tensor]]:
    from rewards.learned.labels import milestone_targets, success_targets

    if kind == "classifier":
        return episodes, [success_targets(e) for e in episodes]
    try:
        return milestone_targets(episodes, labels)
    except ValueError as exc:
        raise ConfigError(f"labels={labels}: {exc}") from None


def _metrics(model: Any, episodes: list[Any], targets: list[torch.Tensor], threshold: float) -> dict[str, Any]:
    from rewards.learned.train import classifier_metrics, progress_metrics

    if model.config.kind == "classifier":
        return classifier_metrics(model, episodes, threshold)
    return progress_metrics(model, episodes, targets)


def _show(title: str, metrics: dict[str, Any]) -> None:
    print(f"{title}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()))


# ----------------------------------------------------------------------------- subcommands


def reward_train(cfg: RewardTrainConfig) -> dict[str, Any]:
    """Fit, report held-out metrics, save. Returns ``{"path", "held_out", "train"}``."""
    from rewards.learned.labels import stage_targets
    from rewards.learned.train import fit_reward_model

    needs_privileged = cfg.kind == "progress" and cfg.labels == "stages"
    keys = None
    if cfg.fit.keys:
        keys = list(cfg.fit.keys) + (["observation.env_state", "observation.state"] if needs_privileged else [])
        keys = list(dict.fromkeys(keys))
    # both sources record what an ``also`` policy sees, so their episodes can be trained on together
    env_cfg = with_source_cameras(cfg.env, cfg.also)
    episodes = load_episodes(env_cfg, cfg.source, keys)
    if cfg.also.dataset or cfg.also.episodes or cfg.also.policy != "expert":
        more = load_episodes(env_cfg, cfg.also, keys, name="also")
        same_observations(episodes, more)
        episodes += more
    kept, targets = _targets(cfg.kind, cfg.labels, episodes)
    try:
        model, train_idx, held_idx = fit_reward_model(
            cfg.kind, kept, targets, cfg.fit, desc=f"fit {cfg.kind}",
            relabel=stage_targets if cfg.kind == "progress" and cfg.labels == "stages" else None)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    held = _metrics(model, [kept[i] for i in held_idx], [targets[i] for i in held_idx], cfg.fit.threshold)
    train = _metrics(model, [kept[i] for i in train_idx], [targets[i] for i in train_idx], cfg.fit.threshold)
    model.config.metrics = {"held_out": held, "train": train, "episodes": len(kept), "env": cfg.env.id,
                            "labels": cfg.labels if cfg.kind == "progress" else "success",
                            "source": dataclasses.asdict(cfg.source), "also": dataclasses.asdict(cfg.also)}
    out = Path(cfg.output) if cfg.output else default_runs_dir() / f"reward-{cfg.kind}-{cfg.env.id.replace('/', '-')}"
    path = model.save(out)
    _show(f"held-out ({len(held_idx)} episodes)", held)
    _show(f"train ({len(train_idx)} episodes)", train)
    term = "classifier" if cfg.kind == "classifier" else "prm"
    print(f"saved {path}; use it with vla-rl train --reward.{term}.path {path} --reward.terms '{{{term}: 1.0}}'")
    return {"path": str(path), "held_out": held, "train": train}


def reward_eval(cfg: RewardEvalConfig) -> dict[str, Any]:
    """A saved model's metrics on the episodes ``cfg.source`` names (all of them count as held out)."""
    from rewards.learned.model import load_reward_model

    model = load_reward_model(cfg.path)
    keys = list(model.config.inputs)
    if model.config.kind == "progress" and cfg.labels == "stages":
        keys = list(dict.fromkeys(keys + ["observation.env_state", "observation.state"]))
    episodes = load_episodes(cfg.env, cfg.source, keys, model)
    kept, targets = _targets(model.config.kind, cfg.labels, episodes)
    metrics = _metrics(model, kept, targets, cfg.threshold)
    _show(f"{cfg.path} on {len(kept)} episodes", metrics)
    if cfg.output:
        Path(cfg.output).write_text(json.dumps(metrics, indent=2))
    return metrics


def reward_reweigh(cfg: ReweighConfig) -> dict[str, Any]:
    """Per stored iteration and overall: how rewards, returns and advantages move under ``cfg.terms``."""
    from rewards.config import RewardConfig
    from vla_rl.reweigh import TRACE_DIR, ReweighError, load_reward_trace, reweigh

    if not cfg.terms:
        raise ConfigError("terms: give the new weights, e.g. --terms '{success: 1.0, env: 0.0}'")
    try:
        new = RewardConfig(terms=dict(cfg.terms)).weights()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    folder = Path(cfg.run) / TRACE_DIR
    files = sorted(folder.glob("iter_*.pt"))
    if cfg.iteration:
        files = [f for f in files if f.name == f"iter_{cfg.iteration:06d}.pt"]
    if not files:
        which = f"for iteration {cfg.iteration} " if cfg.iteration else ""
        raise ConfigError(f"run: no reward traces {which}in {folder} (vla-rl train writes them with "
                          "--reward.save_terms_every >= 1)")
    rows = []
    try:
        for f in files:
            rollout, algo, old = load_reward_trace(f)
            rows.append({"trace": f.name, "weights_old": dict(old), **reweigh(rollout, algo, old, new)})
    except ReweighError as exc:
        raise ConfigError(str(exc)) from None
    keys = ("reward_old", "reward_new", "return_old", "return_new", "adv_abs_change", "adv_corr", "adv_sign_flips")
    overall = {k: sum(r[k] for r in rows) / len(rows) for k in keys}
    print(f"{'trace':<16}" + "".join(f"{k:>15}" for k in keys))
    for r in rows:
        print(f"{r['trace']:<16}" + "".join(f"{r[k]:>15.4f}" for k in keys))
    print(f"{'mean':<16}" + "".join(f"{overall[k]:>15.4f}" for k in keys))
    print(f"weights {rows[0]['weights_old']} -> {dict(new)}: advantages correlate {overall['adv_corr']:.3f} with the "
          f"run's; {100 * overall['adv_sign_flips']:.1f}% of decisions would be pushed the other way")
    result = {"new_weights": dict(new), "iterations": rows, "mean": overall}
    out = Path(cfg.output) if cfg.output else Path(cfg.run) / "reweigh.json"
    out.write_text(json.dumps(result, indent=2))
    return result


REWARD = command_group("reward", "learned rewards and reward weights: reward train | eval | reweigh")
REWARD.register("train", config=RewardTrainConfig,
                help="fit a success classifier or process reward model")(reward_train)
REWARD.register("eval", config=RewardEvalConfig, help="a reward model's metrics on labelled episodes")(reward_eval)
REWARD.register("reweigh", config=ReweighConfig,
                help="a run's advantages under other term weights, without new rollouts")(reward_reweigh)
