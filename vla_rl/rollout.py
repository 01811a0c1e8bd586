"""The rollout engine: step a :class:`sim.VecEnv` with a :class:`policies.Policy` in action chunks.

One *decision* is one ``policy.act`` call returning a chunk ``[B, H, A]``; the
first ``exec_steps`` actions are executed open-loop (:meth:`sim.VecEnv.step_chunk`,
which skips rendering the observations in between where the backend can). The decision's reward is
the sum of the per-step rewards inside the chunk, each step's reward the weighted sum of the
configured reward terms (:class:`rewards.RewardConfig`, applied by :class:`rewards.RewardFunction`,
the one place weights are applied); every term is kept per decision and per step. An env whose
episode ends inside a chunk is held still (zero actions, i.e. no end-effector motion) for the rest
of that chunk (:mod:`sim.chunk`), so no reward of its next episode leaks into the old decision; its
next decision starts from the new episode's observation. A reward term may also end an episode (a success
classifier standing in for the simulator's success, :attr:`rewards.compose.ChunkReward.ends`): the
decision is then terminal and the env is reset before the next decision (sequential collection only).

Everything ``evaluate`` needs (``ActOutput.extras``) is recorded, together
with the value of each decision's true successor (the final observation where
the episode ended), so GAE can bootstrap truncations.

Two collection modes:

- :meth:`RolloutEngine.collect` — ``T`` decisions from wherever the envs are
  (PPO); envs keep running across calls;
- :meth:`RolloutEngine.collect_groups` — every env plays exactly one episode
  from a seeded initial state shared by its group of ``G`` envs (GRPO).

*Pipelined* collection (``pipelined=True``, for envs that run action chunks
asynchronously on groups of workers, :meth:`sim.vector_process.ProcessVecEnv.chunk_async`):
the envs are split into two halves, each a stream of decisions; while one
half executes its chunk in the workers, the policy computes the other half's
next chunk. The rollout is the same as the sequential one (same decisions,
rewards, bootstraps and episodes) for a policy that treats batch rows
independently; with a stochastic policy only the random draws differ. Envs
without that support fall back to sequential collection.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from policies.base import ActMode, ActOutput, Policy
from rewards import RewardConfig, RewardFunction
from sim.chunk import first_episode_steps
from sim.core import TASK, Obs, VecEnv
from sim.tasks import TASK_INDEX
from vla_rl.data.chunks import cat_obs
from vla_rl.timing import StageTimes


@dataclass
class EpisodeRecord:
    """One finished episode."""

    env: int
    task: str
    ret: float
    length: int
    success: bool
    task_index: int = -1
    """Multi-task envs: the episode's index into ``EnvSpec.tasks`` (``task_index`` of its final observation)."""
    ended_by_reward: bool = False
    """A reward term ended it (a success classifier's verdict, :attr:`rewards.compose.ChunkReward.ends`), not the
    env; ``success`` is still the env's own flag (False: the env had not reported success)."""


@dataclass
class Rollout:
    """``T`` decisions of ``B`` envs. Tensors are ``[T, B, ...]``.

    Attributes:
        obs: decision observations, each tensor ``[T, B, ...]``; ``task`` is ``T`` lists of ``B`` strings.
        actions: ``[T, B, H, A]`` chunks as returned by the policy.
        logp: log-probs at the policy's level (``[T, B]``, ``[T, B, H]`` or ``[T, B, H, A]``).
        values: ``[T, B]`` critic values of the decision observations (zeros without a critic).
        extras: the policy's sampler extras, ``[T, B, ...]``.
        rewards: ``[T, B]`` the decision rewards fed to the advantages: the weighted step rewards
            (:class:`rewards.RewardConfig`) summed over each chunk's steps up to the env's episode end.
        reward_terms: name -> ``[T, B]`` every env term and configured term, summed the same way.
        step_reward_terms: name -> ``[T, B, H]`` the same per executed step (0 on held steps).
        step_signals: name -> ``[T, B, H]`` the env's privileged signals per executed step (0 on held
            steps; :class:`sim.single.StepOut`), for constraint costs and analysis; never fed to a policy.
        terminated, truncated: ``[T, B]`` whether the episode ended (and how) inside the chunk.
        next_values: ``[T, B]`` value of each decision's true successor.
        valid: ``[T, B]`` False for decisions after an env's episode ended in group mode.
        group_ids: ``[B]`` group of each env (group mode) or None.
        episodes: episodes that ended during collection.
        env_steps: env steps taken (all envs).
        times: wall seconds of the collection's stages (``time/rollout_env_s``: waiting for the envs,
            ``_act_s``: the policy, ``_value_s``: bootstrap values; :mod:`vla_rl.timing`).
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
    step_reward_terms: dict[str, Tensor] = field(default_factory=dict)
    step_signals: dict[str, Tensor] = field(default_factory=dict)
    episodes: list[EpisodeRecord] = field(default_factory=list)
    env_steps: int = 0
    times: dict[str, float] = field(default_factory=dict)

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


def reward_scalars(rollout: Rollout) -> dict[str, float]:
    """The rollout's reward metrics over its valid decisions: ``rollout/chunk_reward`` (the weighted reward
    fed to the advantages) and ``reward/<term>`` for every term, each the mean per decision."""
    valid = rollout.valid
    out = {"rollout/chunk_reward": float(rollout.rewards[valid].mean())}
    out.update({f"reward/{k}": float(v[valid].mean()) for k, v in rollout.reward_terms.items()})
    return out


def _rows(obs: Obs, idx: list[int]) -> Obs:
    return {k: ([v[i] for i in idx] if k == TASK else v[idx]) for k, v in obs.items()}


def _slice(obs: Obs, a: int, e: int) -> Obs:
    return {k: v[a:e] for k, v in obs.items()}


def _cat_out(parts: list[ActOutput]) -> ActOutput:
    values = [p.value for p in parts]
    return ActOutput(
        actions=torch.cat([p.actions.cpu() for p in parts]), logp=torch.cat([p.logp.cpu() for p in parts]),
        value=None if any(v is None for v in values) else torch.cat([v.cpu() for v in values]),  # type: ignore[union-attr]
        extras={k: torch.cat([p.extras[k].cpu() for p in parts]) for k in parts[0].extras},
    )


def _cat_chunks(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Join the halves' chunk results (env order); episodes in step order, then env order, as sequential."""
    names = sorted({n for p in parts for n in p["terms"]})
    sizes = [len(p["reward"]) for p in parts]
    terms = {n: torch.cat([p["terms"].get(n, torch.zeros(s)) for p, s in zip(parts, sizes)]) for n in names}
    horizon = next((v.shape[0] for p in parts for v in p["step_terms"].values()), 0)
    step_terms = {
        n: torch.cat([p["step_terms"].get(n, torch.zeros(horizon, s)) for p, s in zip(parts, sizes)], dim=1)
        for n in names
    }
    signal_names = sorted({n for p in parts for n in p["signals"]})
    signals = {
        n: torch.cat([p["signals"].get(n, torch.zeros(horizon, s)) for p, s in zip(parts, sizes)], dim=1)
        for n in signal_names
    }
    episodes = sorted((ep for p in parts for ep in p["episodes"]), key=lambda he: (he[0], he[1].env))
    return {
        "reward": torch.cat([p["reward"] for p in parts]), "terms": terms, "step_terms": step_terms,
        "signals": signals,
        "term": torch.cat([p["term"] for p in parts]), "trunc": torch.cat([p["trunc"] for p in parts]),
        "final": {i: f for p in parts for i, f in p["final"].items()},
        "episodes": [ep for _, ep in episodes], "cut": [i for p in parts for i in p.get("cut", [])],
    }


class RolloutEngine:
    """Collect rollouts of ``policy`` in ``env`` (see module doc).

    Args:
        env: the vectorized env.
        policy: any :class:`policies.Policy`.
        exec_steps: actions of each chunk executed before the next decision (<= H; 0 = all H).
        use_critic: compute values (and bootstrap values) with the policy's critic.
        pipelined: overlap env stepping with policy inference (two halves of the envs) when the env
            supports asynchronous chunks (``chunk_groups`` / ``chunk_async`` / ``chunk_wait``); otherwise
            collect sequentially. See the module doc.
        reward: the reward terms and weights (None: the default, the env's own reward).
    """

    def __init__(self, env: VecEnv, policy: Policy, exec_steps: int = 0, use_critic: bool = True,
                 pipelined: bool = False, reward: RewardConfig | None = None) -> None:
        h = policy.chunk_size
        if exec_steps > h:
            raise ValueError(f"exec_steps={exec_steps} is longer than the policy's chunk ({h})")
        self.env = env
        self.policy = policy
        self.exec_steps = exec_steps or h
        self.use_critic = use_critic
        self.pipelined = pipelined
        self.reward = RewardFunction(reward or RewardConfig(), env.spec.env_id)
        if pipelined and self.reward.ends_episodes:
            raise ValueError("a reward term ends episodes (reward.classifier.terminate), which needs sequential "
                             "collection: set --algo.pipelined false, or --reward.classifier.terminate false")
        self._obs: Obs | None = None
        # the running return (env reward) and length of each env's episode, for episodes a reward term ends
        # (kept only when a configured term can end one, :meth:`_cut_episodes`)
        self._ep_ret = torch.zeros(env.num_envs)
        self._ep_len = torch.zeros(env.num_envs, dtype=torch.long)
        self.total_env_steps = 0
        self.times = StageTimes()  # env / act / value seconds of the collection in progress
        self.times_total: dict[str, float] = {}
        """``time/rollout_*`` seconds summed over every collection so far (a caller that collects many short
        rollouts, as ``vla-rl align`` does, reads its breakdown from the difference of two snapshots)."""
        self.generator: torch.Generator | None = None
        """The RNG of the policy's samples (None: torch's global RNG); a learner that trains in another thread
        while this engine collects gives it its own, so that neither thread's draws depend on the other's timing."""

    @property
    def pipeline_groups(self) -> list[list[int]] | None:
        """The two env halves stepped alternately in pipelined mode, or None (sequential collection)."""
        groups = getattr(self.env, "chunk_groups", None)
        return groups(2) if self.pipelined and groups is not None else None

    # ------------------------------------------------------------------ helpers

    def _value(self, obs: Obs) -> Tensor:
        if not self.use_critic:
            return torch.zeros(len(obs[TASK]))
        with torch.no_grad(), self.times("value"):
            return self.policy.value(obs).float().cpu()

    def _run_chunk(self, obs: Obs, actions: Tensor, alive: Tensor) -> dict[str, Any]:
        """Execute one chunk on every env (:meth:`sim.VecEnv.step_chunk`); per-env rewards and terms, end
        flags, final obs rows and the episodes that ended."""
        with self.times("env"):
            steps = self.env.step_chunk(actions[:, : self.exec_steps])
        self.total_env_steps += self.env.num_envs * self.exec_steps
        self._obs = steps.obs
        chunk = _cat_chunks([self._chunk_from_steps(steps, alive, actions, obs)])
        if chunk["cut"]:  # episodes a reward term ended: start the next ones now
            with self.times("env"):
                self._obs = self.env.reset(env_ids=chunk["cut"])
        return chunk

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
        self.reward.reset()
        self._ep_ret.zero_()
        self._ep_len.zero_()
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

    def _decisions_sequential(self, num_decisions: int, mode: ActMode, stop_when_all_ended: bool) -> tuple[list, ...]:
        """Act on all envs, execute the chunk, repeat: per decision (obs, ActOutput, chunk, value, valid)."""
        b = self.env.num_envs
        obs_list, outs, chunks, values, valid = [], [], [], [], []
        alive = torch.ones(b, dtype=torch.bool)
        for _ in range(num_decisions):
            obs = self._obs
            with self.times("act"):
                out = self.policy.act(obs, mode, generator=self.generator)
            value = out.value.float().cpu() if (self.use_critic and out.value is not None) else torch.zeros(b)
            chunk = self._run_chunk(obs, out.actions.cpu(), alive)
            obs_list.append(obs)
            outs.append(out)
            values.append(value)
            valid.append(alive.clone())
            chunks.append(chunk)
            if stop_when_all_ended:
                alive &= ~(chunk["term"] | chunk["trunc"])
                if not alive.any():
                    break
        return obs_list, outs, chunks, values, valid

    def _decisions_pipelined(self, groups: list[list[int]], num_decisions: int, mode: ActMode,
                             stop_when_all_ended: bool) -> tuple[list, ...]:
        """Two halves, each a stream of decisions: act on one half while the other half's chunk runs.

        Schedule per decision d: wait for half 0's chunk d-1, act on half 0, launch it; wait for half 1's
        chunk d-1, act on half 1, launch it. Half 1's inference overlaps half 0's stepping and vice versa.
        In group mode the loop stops after the first decision at which every env has ended, as in
        sequential collection (a half is only launched again once that is known to be false).
        """
        env: Any = self.env
        obs = dict(self._obs)  # type: ignore[arg-type]
        halves = [(g, g[0], g[-1] + 1) for g in groups]
        per_half: list[list[tuple[Obs, ActOutput, Tensor, dict[str, Any], Tensor]]] = [[], []]
        alive = [torch.ones(len(g), dtype=torch.bool) for g in groups]
        in_flight = [False, False]
        done_at: int | None = None  # decision after which every env had ended (group mode)

        def finish(k: int) -> None:
            ids, a, _ = halves[k]
            with self.times("env"):
                steps = env.chunk_wait(ids)
            in_flight[k] = False
            self.total_env_steps += len(ids) * self.exec_steps
            rec = per_half[k][-1]
            chunk = self._chunk_from_steps(steps, rec[4], rec[1].actions.cpu(), rec[0])
            per_half[k][-1] = (*rec[:3], chunk, rec[4])
            for key, value in steps.obs.items():
                if key == TASK:
                    obs[key] = obs[key][:a] + value + obs[key][a + len(ids):]
                else:
                    obs[key] = torch.cat([obs[key][:a], value, obs[key][a + len(ids):]])
            if stop_when_all_ended:
                alive[k] &= ~(chunk["term"] | chunk["trunc"])

        for d in range(num_decisions):
            for k, (ids, a, e) in enumerate(halves):
                if in_flight[k]:
                    finish(k)
                if d > 0 and stop_when_all_ended and not alive[k].any():
                    other = 1 - k
                    if in_flight[other] and len(per_half[other]) == d:  # the other half's decision d-1
                        finish(other)
                    if not alive[other].any() and len(per_half[other]) == d:
                        done_at = d
                        break
                rows = _slice(obs, a, e)
                with self.times("act"):
                    out = self.policy.act(rows, mode, generator=self.generator)
                value = out.value.float().cpu() if (self.use_critic and out.value is not None) else torch.zeros(len(ids))
                per_half[k].append((rows, out, value, {}, alive[k].clone()))
                with self.times("env"):
                    env.chunk_async(out.actions.cpu()[:, : self.exec_steps], ids)
                in_flight[k] = True
            if done_at is not None:
                break
        for k in range(len(halves)):
            if in_flight[k]:
                finish(k)
        self._obs = obs
        t = min(len(h) for h in per_half)
        obs_list, outs, chunks, values, valid = [], [], [], [], []
        for d in range(t):
            recs = [h[d] for h in per_half]
            obs_list.append(cat_obs([r[0] for r in recs]))
            outs.append(_cat_out([r[1] for r in recs]))
            values.append(torch.cat([r[2] for r in recs]))
            chunks.append(_cat_chunks([r[3] for r in recs]))
            valid.append(torch.cat([r[4] for r in recs]))
        return obs_list, outs, chunks, values, valid

    def _chunk_from_steps(self, steps: Any, alive: Tensor, actions: Tensor, obs: Obs) -> dict[str, Any]:
        """:meth:`_run_chunk`'s result for one half, from its :class:`sim.core.ChunkSteps`, the chunk
        ``actions [n, H, A]`` and the decision observation ``obs`` of its envs."""
        ids = steps.env_ids
        rewards = self.reward(steps, actions, obs)
        live = first_episode_steps(steps.terminated, steps.truncated)  # [H, n]: steps of the old episode
        now = (steps.terminated | steps.truncated) & live  # each env's first end, if any
        final: dict[int, Obs] = {}
        episodes: list[tuple[int, EpisodeRecord]] = []
        for h, j in now.nonzero().tolist():
            i = ids[j]
            final[i] = {k: (v[j] if k == TASK else v[j : j + 1]) for k, v in steps.final_obs.items()}
            if alive[j]:
                episodes.append((h, EpisodeRecord(
                    env=i, task=steps.final_obs[TASK][j], ret=float(steps.episode_return[h, j]),
                    length=int(steps.episode_length[h, j]), success=bool(steps.success[h, j]),
                    task_index=int(steps.final_obs[TASK_INDEX][j]) if TASK_INDEX in steps.final_obs else -1,
                )))
        term = (steps.terminated & live).any(0)
        trunc = (steps.truncated & live & ~steps.terminated).any(0)
        cut: list[int] = []  # envs whose episode a reward term ended (the env had not)
        if self.reward.ends_episodes:
            by_reward = self._cut_episodes(steps, live, term | trunc, rewards.ends, alive, episodes)
            term = term | by_reward.to(term.device)
            cut = [ids[j] for j in by_reward.nonzero().flatten().tolist()]
        zero = torch.zeros((), dtype=torch.float32)
        signals = {k: torch.where(live, v.float().cpu(), zero) for k, v in steps.signals.items()}
        return {"reward": rewards.reward, "terms": rewards.terms, "step_terms": rewards.step_terms,
                "signals": signals, "term": term,
                "trunc": trunc, "final": final, "episodes": episodes, "cut": cut}

    def _cut_episodes(self, steps: Any, live: Tensor, ended: Tensor, ends: Tensor | None, alive: Tensor,
                      episodes: list[tuple[int, EpisodeRecord]]) -> Tensor:
        """Keep each env's running episode return (env reward) and length, and record the episodes a reward term
        ends (``ends`` where the env had not ``ended`` them) into ``episodes``; returns them as ``bool [n]``."""
        ids = steps.env_ids
        reward, held, ended = steps.reward.float().cpu(), ~live.cpu(), ended.cpu()
        idx = torch.as_tensor(ids)
        self._ep_len[idx] = torch.where(ended, held.sum(0), self._ep_len[idx] + held.shape[0])
        self._ep_ret[idx] = torch.where(ended, (reward * held).sum(0), self._ep_ret[idx] + reward.sum(0))
        cut = torch.zeros_like(ended) if ends is None else ends.cpu() & ~ended
        for j in cut.nonzero().flatten().tolist():
            i = ids[j]
            if alive[j]:
                episodes.append((live.shape[0] - 1, EpisodeRecord(
                    env=i, task=steps.obs[TASK][j], ret=float(self._ep_ret[i]), length=int(self._ep_len[i]),
                    success=False, ended_by_reward=True,
                    task_index=int(steps.obs[TASK_INDEX][j]) if TASK_INDEX in steps.obs else -1,
                )))
            self._ep_ret[i], self._ep_len[i] = 0.0, 0
        return cut

    def _collect(self, num_decisions: int, mode: ActMode, group_ids: Tensor | None, stop_when_all_ended: bool) -> Rollout:
        b = self.env.num_envs
        steps_before = self.total_env_steps
        self.times.take()  # drop anything timed outside this collection
        groups = self.pipeline_groups
        if groups is not None:
            obs_list, outs, chunks, values, valid = self._decisions_pipelined(
                groups, num_decisions, mode, stop_when_all_ended)
        else:
            obs_list, outs, chunks, values, valid = self._decisions_sequential(num_decisions, mode, stop_when_all_ended)
        episodes = [e for c in chunks for e in c["episodes"]]
        # Successor values: the next decision's value, the final obs's value where truncated, 0 where terminated.
        last_value = self._value(self._obs) if self.use_critic else torch.zeros(b)
        next_values = torch.stack(values[1:] + [last_value])
        for i, chunk in enumerate(chunks):
            self._bootstrap(next_values[i], chunk)
        stacked_obs: dict[str, Any] = {}
        for k in obs_list[0]:
            stacked_obs[k] = [o[k] for o in obs_list] if k == TASK else torch.stack([o[k] for o in obs_list])
        times = self.times.take("time/rollout_")
        for k, v in times.items():
            self.times_total[k] = self.times_total.get(k, 0.0) + v
        term_names = sorted({n for c in chunks for n in c["terms"]})
        signal_names = sorted({n for c in chunks for n in c["signals"]})
        return Rollout(
            obs=stacked_obs,
            actions=torch.stack([o.actions.cpu() for o in outs]),
            logp=torch.stack([o.logp.cpu() for o in outs]),
            values=torch.stack(values),
            extras={k: torch.stack([o.extras[k].cpu() for o in outs]) for k in outs[0].extras},
            rewards=torch.stack([c["reward"] for c in chunks]),
            reward_terms={n: torch.stack([c["terms"].get(n, torch.zeros(b)) for c in chunks]) for n in term_names},
            step_reward_terms={n: torch.stack([c["step_terms"].get(n, torch.zeros(self.exec_steps, b)).T
                                               for c in chunks]) for n in term_names},
            step_signals={n: torch.stack([c["signals"].get(n, torch.zeros(self.exec_steps, b)).T
                                          for c in chunks]) for n in signal_names},
            terminated=torch.stack([c["term"] for c in chunks]),
            truncated=torch.stack([c["trunc"] for c in chunks]),
            next_values=next_values,
            valid=torch.stack(valid),
            group_ids=group_ids,
            episodes=episodes,
            env_steps=self.total_env_steps - steps_before,
            times=times,
        )
