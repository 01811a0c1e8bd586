"""Turn one chunk's outcome into the learner's rewards: the one place term weights are applied.

:class:`RewardFunction` evaluates the configured terms on a chunk (env terms straight from the
:class:`sim.core.ChunkSteps`, computed terms step by step from a :class:`rewards.terms.StepInput`),
applies the weights (:func:`weighted_step_reward`) and sums the steps that belong to each env's episode
(:func:`chunk_sum`). A term the env reports is read from the env; any other configured name is
called step by step (an unknown one raises :class:`rewards.terms.RewardTermError` on the first
chunk). The sums run in float32 in step order, so with the default config (``{env: 1}``)
the decision rewards are bit-identical to summing the env's step rewards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rewards.config import RewardConfig
from rewards.terms import RewardTerm, StepInput, env_terms, make_term
from sim.chunk import first_episode_steps
from sim.core import TASK, ChunkSteps, Obs


@dataclass
class ChunkReward:
    """The rewards of one chunk on ``n`` envs.

    Attributes:
        reward: ``float32 [n]`` the decision reward: the weighted step rewards summed over the steps of
            each env's episode (the held steps after its end excluded).
        step_reward: ``float32 [H, n]`` the weighted reward per step (0 on held steps).
        terms: name -> ``float32 [n]`` each term summed like ``reward`` (every env term and every
            configured term).
        step_terms: name -> ``float32 [H, n]`` each term per step (0 on held steps).
        ends: ``bool [n]`` the envs whose episode a term ends at the chunk's outcome (a success classifier
            with ``terminate``; :meth:`rewards.terms.RewardTerm`), whether or not the env itself ended it.
    """

    reward: Tensor
    step_reward: Tensor
    terms: dict[str, Tensor]
    step_terms: dict[str, Tensor]
    ends: Tensor | None = None


def weighted_step_reward(terms: dict[str, Tensor], weights: Sequence[tuple[str, float]]) -> Tensor:
    """``sum_k weight_k * terms[k]`` in float32, in the order of ``weights``, starting from 0.

    Args:
        terms: name -> ``[H, n]`` (or any common shape) term values.
        weights: ``[(name, weight)]``; every name must be in ``terms``.

    Returns:
        ``float32`` tensor of the terms' shape. A single term of weight 1 is returned bit for bit.
    """
    first = terms[weights[0][0]]
    out = torch.zeros(first.shape, dtype=torch.float32)
    for name, weight in weights:
        out = out + weight * terms[name].float()
    return out


def chunk_sum(per_step: Tensor, live: Tensor) -> Tensor:
    """Sum ``per_step [H, n]`` over the steps where ``live [H, n]``, one step after the other (float32).

    The sequential order is part of the contract: the decision rewards fed to GAE must not change
    with the reward seam (float32 addition is not associative).
    """
    out = torch.zeros(per_step.shape[1], dtype=torch.float32)
    for h in range(per_step.shape[0]):
        out += torch.where(live[h], per_step[h], torch.zeros_like(per_step[h]))
    return out


def episodes_ended(steps: ChunkSteps, live: Tensor) -> Tensor:
    """``bool [n]``: the envs whose episode ended inside the chunk (``live [H, n]``: the steps of each env's first
    episode, :func:`sim.chunk.first_episode_steps`)."""
    return ((steps.terminated.cpu() | steps.truncated.cpu()) & live).any(0)


def outcome_obs(steps: ChunkSteps, live: Tensor) -> Obs:
    """The observation each env's chunk ended in: ``final_obs`` rows of the envs whose episode ended inside the
    chunk, ``obs`` rows of the others (a new batch; tensors on the CPU). ``live [H, n]``: the steps of each
    env's first episode (:func:`sim.chunk.first_episode_steps`)."""
    ended = episodes_ended(steps, live)
    out: Obs = {}
    for key, value in steps.obs.items():
        final = steps.final_obs[key]
        if key == TASK:
            out[key] = [f if e else v for f, v, e in zip(final, value, ended.tolist())]
        else:
            mask = ended.reshape(-1, *([1] * (value.dim() - 1)))
            out[key] = torch.where(mask, final.cpu(), value.cpu())
    return out


class RewardFunction:
    """The configured reward of one env (see module doc).

    Args:
        config: the terms and weights.
        env_id: the env's id, named in errors.
    """

    def __init__(self, config: RewardConfig, env_id: str) -> None:
        self.config = config
        self.env_id = env_id
        self.weights = config.weights()
        self._terms: dict[str, RewardTerm] = {name: make_term(name, getattr(config, name, None))
                                              for name, _ in self.weights}

    def set_progress(self, progress: float) -> None:
        """Move the annealed weights (``RewardConfig.anneal``) to training's ``progress`` (``iteration /
        iterations``); the terms' per-episode state is kept."""
        self.weights = self.config.weights(progress)

    @property
    def ends_episodes(self) -> bool:
        """Whether a configured term can end episodes (a success classifier with ``terminate``)."""
        return any(getattr(t, "ends_episodes", False) for t in self._terms.values())

    def reset(self) -> None:
        """Every env starts a new episode (the caller reset them all): terms that keep per-episode state (the
        ``prm`` term's ``milestone`` form) start it again."""
        for term in self._terms.values():
            if hasattr(term, "reset"):
                term.reset()  # type: ignore[attr-defined]

    def __call__(self, steps: ChunkSteps, actions: Tensor, obs: Obs) -> ChunkReward:
        """The rewards of one chunk.

        Args:
            steps: the chunk's outcome on ``n`` envs, ``H`` steps.
            actions: ``[n, >=H, A]`` the chunk the policy chose (its first ``H`` steps were executed,
                held envs' rows replaced by zeros as :mod:`sim.chunk` does).
            obs: the decision observation of the ``n`` envs.

        Raises:
            rewards.terms.RewardTermError: for a configured term the env does not report and no registered term
                computes (names the term, the env id and the env's terms).
        """
        live = first_episode_steps(steps.terminated.cpu(), steps.truncated.cpu())
        values = env_terms(steps)
        horizon = live.shape[0]
        executed: Tensor | None = None
        outcome: Obs = {}
        ends = torch.zeros(live.shape[1], dtype=torch.bool)
        last = live & ~torch.cat([live[1:], torch.zeros_like(live[:1])])  # [H, n]: each env's last live step
        for name, term in self._terms.items():
            if name in values:  # reported by the env: read straight from the chunk
                continue
            if executed is None:  # [n, H, A]; held steps ran zero actions
                executed = torch.where(live.T[:, :, None], actions[:, :horizon].float().cpu(), 0.0)
                outcome = outcome_obs(steps, live)
            per_step = []
            for h in range(horizon):
                step = StepInput(
                    env_id=self.env_id, step=h, obs=obs, action=executed[:, h],
                    env_terms={k: v[h] for k, v in values.items()}, success=steps.success[h].cpu(),
                    terminated=steps.terminated[h].cpu(), truncated=steps.truncated[h].cpu(),
                    signals={k: v[h].float().cpu() for k, v in steps.signals.items()}, executed=executed,
                    next_obs=outcome, last=last[h], env_ids=list(steps.env_ids),
                )
                per_step.append(term(step).float().cpu().reshape(-1))
            values[name] = torch.stack(per_step)
            if getattr(term, "ends_episodes", False):
                ends = ends | term.episode_end().bool().cpu().reshape(-1)  # type: ignore[attr-defined]
        ended = episodes_ended(steps, live) | ends  # ended by the env or by a term
        for term in self._terms.values():
            if hasattr(term, "episodes_ended"):
                term.episodes_ended(steps.env_ids, ended)  # type: ignore[attr-defined]
        step_reward = weighted_step_reward(values, self.weights)
        zero = torch.zeros((), dtype=torch.float32)
        return ChunkReward(
            reward=chunk_sum(step_reward, live),
            step_reward=torch.where(live, step_reward, zero),
            terms={k: chunk_sum(v, live) for k, v in values.items()},
            step_terms={k: torch.where(live, v, zero) for k, v in values.items()},
            ends=ends,
        )
