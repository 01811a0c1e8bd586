"""The learned reward terms: ``classifier`` (a success classifier) and ``prm`` (a process reward model).

Both are computed terms (:data:`rewards.terms.REWARDS`) configured in :class:`rewards.config.RewardConfig`
(``--reward.terms '{classifier: 1.0}' --reward.classifier.path DIR``). A learned model judges states the
policy's cameras show, and inside a chunk only the chunk's outcome is rendered, so both pay on each env's
last step of the chunk (the step its episode ended, or the chunk's last) from the outcome observation
(:attr:`rewards.terms.StepInput.next_obs`) and pay 0 on the other steps:

- ``classifier``: ``1`` when ``P(success | outcome) >= threshold`` (or the probability itself with
  ``threshold: 0``). With ``--reward.terms '{classifier: 1.0}'`` the learner never sees the simulator's
  success reward; evaluation still scores the simulator's success. By default (``terminate``) a success
  verdict also ends the episode, as the simulator's success does: the rollout engine resets the env and
  the decision is terminal, so each success is paid once.
- ``prm``: progress paid per chunk, in one of two forms (``--reward.prm.mode``):

  - ``potential`` (the default): ``progress(outcome) - progress(decision observation)``, a potential
    difference (Ng et al. 1999): over an episode it sums to the progress gained, so it cannot be farmed by
    going back and forth. Under GAE (gamma = 1) that same property makes it a change of the critic's
    baseline: ``r + g*V(s') - V(s)`` with the difference added is the unshaped TD error of the critic
    ``V + progress``, except where an episode terminates, which bootstraps nothing: there the terminal
    state's progress stays paid. Mixed with sparse success (``{success: 1.0, prm: 0.5}``), once PPO's
    critic has fit the shaped returns the advantages are those of a success worth ``1 + w * progress(success
    state)``, so the optimal policy is the sparse reward's where the model scores success states alike
    (docs/rewards.md).
  - ``milestone``: ``max(0, progress(outcome) - best progress of the episode so far)``, VLA-RL's form (a
    sub-task's completion is paid when first reached, once per episode): the episode is paid the best
    progress it reached, so an attempt that grasped the right cube and dropped it still earns the grasp,
    which a critic cannot absorb. It sums to at most 1 per episode (cannot be farmed), and it does change
    the optimal policy only where the weight lets an episode's progress outweigh its success: keep the
    ``prm`` weight at or below ``success``'s. The episode's best is kept per env and restarts where the
    episode does (the env ended it, a reward term ended it, or the rollout engine reset the envs).

The model is loaded once per :class:`rewards.compose.RewardFunction` and evaluated once per chunk (on the
CPU, in batches). A model whose inputs do not match the env's observations raises
:class:`rewards.learned.model.RewardInputError` on the first chunk, naming the key and both shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rewards.learned.model import RewardModel, load_reward_model
from rewards.terms import REWARDS, RewardTerm, StepInput


PRM_MODES = ("potential", "milestone")
"""The forms of the ``prm`` term (:attr:`ProgressTermConfig.mode`)."""


@dataclass
class ClassifierTermConfig:
    """The ``classifier`` term: a success classifier's verdict on each chunk's outcome."""

    path: str = ""
    """Reward model folder of kind ``classifier`` (``vla-rl reward train --kind classifier``)."""
    threshold: float = 0.5
    """Pay 1 when P(success) >= threshold, else 0; 0 = pay the probability itself."""
    terminate: bool = True
    """End the episode when the classifier says success (P >= threshold, 0.5 with ``threshold: 0``), as
    LeRobot's human-in-the-loop RL does: the rollout engine resets that env and the decision is terminal,
    so a success is paid once. False pays every chunk whose outcome looks like success, which a policy
    farms by holding a state the classifier misjudges instead of finishing (docs/results.md,
    "What does not work, and why")."""


@dataclass
class ProgressTermConfig:
    """The ``prm`` term: progress gained over each chunk by a process reward model."""

    path: str = ""
    """Reward model folder of kind ``progress`` (``vla-rl reward train --kind progress``)."""
    mode: str = "potential"
    """``potential``: progress gained over the chunk (may be negative); ``milestone``: progress above the
    episode's best so far (never negative; module doc)."""

    def __post_init__(self) -> None:
        if self.mode not in PRM_MODES:
            raise ValueError(f"reward.prm.mode: {self.mode!r} is not one of {', '.join(PRM_MODES)}")


def _model(path: str, kind: str, term: str) -> RewardModel:
    from policies.io import CheckpointError

    if not path:
        raise CheckpointError(f"reward term {term!r} needs --reward.{term}.path <reward model folder> "
                              f"(train one with `vla-rl reward train --kind {kind}`)")
    model = load_reward_model(path)
    if model.config.kind != kind:
        raise CheckpointError(f"reward.{term}.path: {path} holds a {model.config.kind!r} model; the {term!r} "
                              f"term needs a {kind!r} model")
    return model


class _ChunkOutcomeTerm:
    """Evaluates a model once per chunk (the first step's call) and pays on each env's last live step."""

    def __init__(self, model: RewardModel) -> None:
        self.model = model
        self._key: object = None
        self._value = torch.zeros(0)

    def chunk_value(self, step: StepInput) -> Tensor:  # pragma: no cover - overridden
        raise NotImplementedError

    def __call__(self, step: StepInput) -> Tensor:
        """``float32 [B]``: the chunk's value on the env's last live step, 0 elsewhere."""
        if step.next_obs is None or step.last is None:
            raise ValueError(f"reward term on {step.env_id}: a learned term needs the chunk's outcome observation "
                             "(StepInput.next_obs), which rewards.compose.RewardFunction provides")
        if self._key is not step.next_obs:
            self._key, self._value = step.next_obs, self.chunk_value(step)
        return torch.where(step.last, self._value, torch.zeros_like(self._value))


class ClassifierTerm(_ChunkOutcomeTerm):
    """See the module doc (``classifier``)."""

    def __init__(self, model: RewardModel, threshold: float, terminate: bool = True) -> None:
        super().__init__(model)
        self.threshold = threshold
        self.ends_episodes = terminate
        self._success = torch.zeros(0, dtype=torch.bool)

    def chunk_value(self, step: StepInput) -> Tensor:
        p = self.model.predict(step.next_obs, where=f"{step.env_id} observation")  # type: ignore[arg-type]
        self._success = p >= (self.threshold if self.threshold > 0 else 0.5)
        return self._success.float() if self.threshold > 0 else p

    def episode_end(self) -> Tensor:
        """``bool [B]``: the envs whose chunk outcome the classifier judged a success (asked with ``terminate``)."""
        return self._success.clone()


class ProgressTerm(_ChunkOutcomeTerm):
    """See the module doc (``prm``)."""

    def __init__(self, model: RewardModel, mode: str = "potential") -> None:
        super().__init__(model)
        self.mode = mode
        # milestone: per env id, the best progress of its episode so far, and whether its next decision starts
        # an episode (the pipelined engine calls with half of the envs at a time, so the state is kept by id)
        self._best = torch.zeros(0)
        self._fresh = torch.zeros(0, dtype=torch.bool)

    def _rows(self, env_ids: list[int] | None, n: int) -> Tensor:
        """The state rows of a chunk's ``n`` envs (``env_ids``; ``0..n-1`` without them), the state grown to hold
        them (a new row starts an episode)."""
        ids = torch.arange(n) if env_ids is None else torch.as_tensor(env_ids, dtype=torch.long)
        extra = (int(ids.max()) + 1 if len(ids) else 0) - len(self._best)
        if extra > 0:
            self._best = torch.cat([self._best, torch.zeros(extra)])
            self._fresh = torch.cat([self._fresh, torch.ones(extra, dtype=torch.bool)])
        return ids

    def chunk_value(self, step: StepInput) -> Tensor:
        where = f"{step.env_id} observation"
        after = self.model.predict(step.next_obs, where=where)  # type: ignore[arg-type]
        before = self.model.predict(step.obs, where=where)
        if self.mode == "potential":
            return after - before
        ids = self._rows(step.env_ids, len(before))
        best = torch.where(self._fresh[ids], before, self._best[ids])  # a new episode starts from where it is
        self._best[ids] = torch.maximum(best, after)
        self._fresh[ids] = False
        return (after - best).clamp(min=0.0)

    def episodes_ended(self, env_ids: list[int], ended: Tensor) -> None:
        """``ended bool [B]``: which of the chunk's envs ``env_ids`` it ended an episode of (their next decision
        starts a new one)."""
        if self.mode == "milestone":
            self._fresh[self._rows(env_ids, len(ended))] |= ended.bool().cpu()

    def reset(self) -> None:
        """Every env starts a new episode (the rollout engine reset them all)."""
        self._fresh[:] = True


@REWARDS.register("classifier", config=ClassifierTermConfig,
                  help="a learned success classifier on each chunk's outcome (--reward.classifier.path)")
def classifier(cfg: ClassifierTermConfig) -> RewardTerm:
    """The ``classifier`` term (module doc).

    Raises:
        policies.io.CheckpointError: for a missing path, a damaged folder or a model of another kind.
    """
    return ClassifierTerm(_model(cfg.path, "classifier", "classifier"), cfg.threshold, cfg.terminate)


@REWARDS.register("prm", config=ProgressTermConfig,
                  help="a learned process reward model: progress gained per chunk, or above the episode's "
                       "best (--reward.prm.path, --reward.prm.mode)")
def prm(cfg: ProgressTermConfig) -> RewardTerm:
    """The ``prm`` term (module doc).

    Raises:
        policies.io.CheckpointError: for a missing path, a damaged folder or a model of another kind.
    """
    return ProgressTerm(_model(cfg.path, "progress", "prm"), cfg.mode)
