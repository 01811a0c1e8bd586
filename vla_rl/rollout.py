"""The rollout engine: step a :class:`sim.VecEnv` with a :class:`policies.Policy` in action chunks.

One *decision* is one ``policy.act`` call returning a chunk ``[B, H, A]``; the
first ``exec_steps`` actions are executed open-loop. The decision's reward is
the sum of the per-step rewards inside the chunk. An env whose episode ends
inside a chunk is held still (zero actions, i.e. no end-effector motion) for
the rest of that chunk, so no reward of its next episode leaks into the old
decision; its next decision starts from the new episode's observation.

Everything ``evaluate`` needs (``ActOutput.extras``) is recorded, together
with the value of each decision's true successor (the final observation where
the episode ended, see ALGORITHMS.md), so GAE can bootstrap truncations.

Two collection modes:

- :meth:`RolloutEngine.collect` — ``T`` decisions from wherever the envs are
  (PPO); envs keep running across calls;
- :meth:`RolloutEngine.collect_groups` — every env plays exactly one episode
  from a seeded initial state shared by its group of ``G`` envs (GRPO).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from policies.base import ActMode, Policy
from sim.core import TASK, Obs, VecEnv


@dataclass
class EpisodeRecord:
    """One finished episode."""

    env: int
    task: str
    ret: float
    length: int
    success: bool


@dataclass
class Rollout:
    """``T`` decisions of ``B`` envs. Tensors are ``[T, B, ...]``.

    Attributes:
        obs: decision observations, each tensor ``[T, B, ...]``; ``task`` is ``T`` lists of ``B`` strings.
        actions: ``[T, B, H, A]`` chunks as returned by the policy.
        logp: log-probs at the policy's level (``[T, B]``, ``[T, B, H]`` or ``[T, B, H, A]``).
        values: ``[T, B]`` critic values of the decision observations (zeros without a critic).
        extras: the policy's sampler extras, ``[T, B, ...]``.
        rewards: ``[T, B]`` summed per chunk; ``reward_terms`` the same per named term.
        terminated, truncated: ``[T, B]`` whether the episode ended (and how) inside the chunk.
        next_values: ``[T, B]`` value of each decision's true successor.
        valid: ``[T, B]`` False for decisions after an env's episode ended in group mode.
        group_ids: ``[B]`` group of each env (group mode) or None.
        episodes: episodes that ended during collection.
        env_steps: env steps taken (all envs).
    """

    obs: dict[str, Any]
    actions: Tensor
    logp: Tensor
    values: Tensor
    extras: dict[str, Tensor]
    rewards: Tensor
    reward_terms: dict[str, Tensor]
    terminated: Tensor
    truncated: Tensor
    next_values: Tensor
    valid: Tensor
    group_ids: Tensor | None = None
    episodes: list[EpisodeRecord] = field(default_factory=list)
    env_steps: int = 0

    @property
    def num_decisions(self) -> int:
        return int(self.valid.sum())

    def episode_returns(self) -> Tensor:
        """``[B]`` return of each env's (single) episode in group mode: the sum of its valid rewards."""
        return (self.rewards * self.valid).sum(0)

    def flat_obs(self, index: Tensor) -> Obs:
        """Observations of flat decision indices ``index`` (into ``T * B``), batch-first."""
        out: Obs = {}
        for k, v in self.obs.items():
            if k == TASK:
                flat = [t for row in v for t in row]
                out[k] = [flat[i] for i in index.tolist()]
            else:
                out[k] = v.flatten(0, 1)[index]
        return out


def _rows(obs: Obs, idx: list[int]) -> Obs:
    return {k: ([v[i] for i in idx] if k == TASK else v[idx]) for k, v in obs.items()}


class RolloutEngine:
    """Collect rollouts of ``policy`` in ``env`` (see module doc).

    Args:
        env: the vectorized env.
        policy: any :class:`policies.Policy`.
        exec_steps: actions of each chunk executed before the next decision (<= H; 0 = all H).
        use_critic: compute values (and bootstrap values) with the policy's critic.
    """

    def __init__(self, env: VecEnv, policy: Policy, exec_steps: int = 0, use_critic: bool = True) -> None:
        h = policy.chunk_size
        if exec_steps > h:
            raise ValueError(f"exec_steps={exec_steps} is longer than the policy's chunk ({h})")
        self.env = env
        self.policy = policy
        self.exec_steps = exec_steps or h
        self.use_critic = use_critic
        self._obs: Obs | None = None
        self.total_env_steps = 0

    # ------------------------------------------------------------------ helpers

    def _value(self, obs: Obs) -> Tensor:
        if not self.use_critic:
            return torch.zeros(len(obs[TASK]))
        with torch.no_grad():
            return self.policy.value(obs).float().cpu()

    def _run_chunk(self, actions: Tensor, alive: Tensor) -> dict[str, Any]:
        """Execute one chunk; returns per-env reward sums, end flags, final obs rows and episodes."""
        b = self.env.num_envs
        reward = torch.zeros(b)
        terms: dict[str, Tensor] = defaultdict(lambda: torch.zeros(b))
        ended = torch.zeros(b, dtype=torch.bool)
        term = torch.zeros(b, dtype=torch.bool)
        trunc = torch.zeros(b, dtype=torch.bool)
        final: dict[int, Obs] = {}
        episodes: list[EpisodeRecord] = []
        obs = self._obs
        for h in range(self.exec_steps):
            step_actions = torch.where(ended[:, None], torch.zeros_like(actions[:, h]), actions[:, h])
            obs, r, te, tr, info = self.env.step(step_actions)
            self.total_env_steps += b
            live = ~ended
            reward += torch.where(live, r, torch.zeros_like(r))
            for name, value in info.get("reward_terms", {}).items():
                terms[name] += torch.where(live, value, torch.zeros_like(value))
            now = (te | tr) & live
            if now.any():
                idx = now.nonzero().flatten().tolist()
                fin = _rows(info["final_obs"], idx)
                for j, i in enumerate(idx):
                    final[i] = {k: (v[j] if k == TASK else v[j : j + 1]) for k, v in fin.items()}
                    if alive[i]:
                        ep = info["episode"]
                        episodes.append(EpisodeRecord(
                            env=i, task=fin[TASK][j], ret=float(ep["return"][i]), length=int(ep["length"][i]),
                            success=bool(ep["success"][i]),
                        ))
                term |= te & live
                trunc |= tr & live & ~te
                ended |= now
        self._obs = obs
        return {"reward": reward, "terms": dict(terms), "term": term, "trunc": trunc, "final": final, "episodes": episodes}

    def _bootstrap(self, next_values: Tensor, chunk: dict[str, Any]) -> None:
        """Replace next values of truncated envs by the value of their final observation."""
        idx = chunk["trunc"].nonzero().flatten().tolist()
        if idx and self.use_critic:
            rows = [chunk["final"][i] for i in idx]
            batch = {k: ([r[k] for r in rows] if k == TASK else torch.cat([r[k] for r in rows])) for k in rows[0]}
            next_values[idx] = self._value(batch)
        next_values[chunk["term"]] = 0.0

    # ------------------------------------------------------------------ modes

    def reset(self, seed: int | list[int] | None = None) -> None:
        """Reset every env (``seed`` as in :meth:`sim.VecEnv.reset`) and the policy's episode state."""
        self._obs = self.env.reset(seed=seed)
        self.policy.reset()

    @torch.no_grad()
    def collect(self, num_decisions: int, mode: ActMode = ActMode.EXPLORE) -> Rollout:
        """``num_decisions`` chunks per env, continuing from the envs' current state."""
        if self._obs is None:
            self.reset()
        return self._collect(num_decisions, mode, group_ids=None, stop_when_all_ended=False)

    @torch.no_grad()
    def collect_groups(self, seeds: list[int], group_size: int, max_decisions: int, mode: ActMode = ActMode.EXPLORE) -> Rollout:
        """One episode per env; env ``g * group_size + j`` starts from ``seeds[g]``.

        Raises:
            ValueError: if ``len(seeds) * group_size != num_envs``.
        """
        b = self.env.num_envs
        if len(seeds) * group_size != b:
            raise ValueError(f"{len(seeds)} groups x group_size {group_size} != num_envs {b}")
        self.reset(seed=[s for s in seeds for _ in range(group_size)])
        group_ids = torch.arange(len(seeds)).repeat_interleave(group_size)
        return self._collect(max_decisions, mode, group_ids=group_ids, stop_when_all_ended=True)

    def _collect(self, num_decisions: int, mode: ActMode, group_ids: Tensor | None, stop_when_all_ended: bool) -> Rollout:
        b = self.env.num_envs
        steps_before = self.total_env_steps
        obs_list, outs, chunks, values, valid = [], [], [], [], []
        alive = torch.ones(b, dtype=torch.bool)
        episodes: list[EpisodeRecord] = []
        for _ in range(num_decisions):
            obs = self._obs
            out = self.policy.act(obs, mode)
            value = out.value.float().cpu() if (self.use_critic and out.value is not None) else torch.zeros(b)
            chunk = self._run_chunk(out.actions.cpu(), alive)
            obs_list.append(obs)
            outs.append(out)
            values.append(value)
            valid.append(alive.clone())
            chunks.append(chunk)
            episodes += chunk["episodes"]
            if stop_when_all_ended:
                alive &= ~(chunk["term"] | chunk["trunc"])
                if not alive.any():
                    break
        # Successor values: the next decision's value, the final obs's value where truncated, 0 where terminated.
        last_value = self._value(self._obs) if self.use_critic else torch.zeros(b)
        next_values = torch.stack(values[1:] + [last_value])
        for i, chunk in enumerate(chunks):
            self._bootstrap(next_values[i], chunk)
        stacked_obs: dict[str, Any] = {}
        for k in obs_list[0]:
            stacked_obs[k] = [o[k] for o in obs_list] if k == TASK else torch.stack([o[k] for o in obs_list])
        term_names = sorted({n for c in chunks for n in c["terms"]})
        return Rollout(
            obs=stacked_obs,
            actions=torch.stack([o.actions.cpu() for o in outs]),
            logp=torch.stack([o.logp.cpu() for o in outs]),
            values=torch.stack(values),
            extras={k: torch.stack([o.extras[k].cpu() for o in outs]) for k in outs[0].extras},
            rewards=torch.stack([c["reward"] for c in chunks]),
            reward_terms={n: torch.stack([c["terms"].get(n, torch.zeros(b)) for c in chunks]) for n in term_names},
            terminated=torch.stack([c["term"] for c in chunks]),
            truncated=torch.stack([c["trunc"] for c in chunks]),
            next_values=next_values,
            valid=torch.stack(valid),
            group_ids=group_ids,
            episodes=episodes,
            env_steps=self.total_env_steps - steps_before,
        )
