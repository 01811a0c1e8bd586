"""Batch :class:`sim.single.SingleEnv` instances into a :class:`sim.core.VecEnv`.

Two drivers share one bookkeeping base:

- :class:`SerialVecEnv` steps all envs in this process (fast tasks, tests);
- :class:`sim.vector_process.ProcessVecEnv` spreads envs over worker processes started with the
  ``forkserver`` (or ``spawn``) context, so simulators and renderers are
  always created inside a fresh worker, never before a fork. Observations,
  actions and per-step scalars (reward, flags, named reward terms) travel
  through shared memory; per step each pipe carries one byte each way (per
  action chunk five bytes out, one back), plus the new instructions of envs
  that reset (pickled) when some did.

Both auto-reset ended envs, keep the ended episode's final observation, track
episode return/length/success and check action shapes. Both run whole action
chunks (:meth:`VecEnv.step_chunk`) with :func:`run_chunk`, which renders an
env only where its observation is read: after the chunk and where an episode
ends (:meth:`SingleEnv.step_unrendered`).

:class:`~sim.vector_process.ProcessVecEnv` also runs whole action chunks asynchronously on a
group of workers (``chunk_async`` / ``chunk_wait``), so a caller can compute the next chunk of
one group of envs while another group steps (pipelined rollouts). Inside a
chunk an env whose episode ends is auto-reset and then held still (zero
actions) for the rest of the chunk (:mod:`sim.chunk`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import torch.multiprocessing  # noqa: F401  (registers tensor sharing over pipes)

from sim.chunk import ChunkHold
from sim.core import TASK, ChunkSteps, EnvError, EnvSpec, Obs, VecEnv, normalize_env_ids, seeds_for_ids
from sim.single import SingleEnv
from sim.tasks import TASK_INDEX, check_weights

EnvFactory = Callable[[], SingleEnv]


class _Bookkeeping(VecEnv):
    """Episode statistics, final observations and the batch obs view."""

    def _init_books(self, spec: EnvSpec, num_envs: int) -> None:
        self.spec = spec
        self.num_envs = num_envs
        self._instructions = [""] * num_envs
        self._ep_return = np.zeros(num_envs, dtype=np.float64)
        self._ep_len = np.zeros(num_envs, dtype=np.int64)
        self._closed = False

    def _batch(self, bufs: dict[str, np.ndarray]) -> Obs:
        obs: Obs = {k: torch.from_numpy(v.copy()) for k, v in bufs.items()}
        obs[TASK] = list(self._instructions)
        return obs

    def _finish_step(
        self,
        reward: np.ndarray,
        term: np.ndarray,
        trunc: np.ndarray,
        success: np.ndarray,
        terms: dict[str, np.ndarray] | None,
        obs: Obs,
        obs_bufs: dict[str, np.ndarray],
        final_bufs: dict[str, np.ndarray],
        final_instructions: list[str] | None,
    ) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Episode statistics and ``info`` of one batch step.

        ``reward`` (float32), ``term``, ``trunc``, ``success`` (bool) and the ``terms`` arrays (float32
        ``[B]``) are fresh arrays owned by the returned tensors; ``obs`` is the returned batch, whose
        numpy rows are ``obs_bufs``; ``final_bufs`` rows hold the final observation of envs that ended
        and ``final_instructions`` the instructions before the step (None when nothing ended).
        """
        self._ep_return += reward
        self._ep_len += 1
        done = term | trunc
        info: dict[str, Any] = {"success": torch.from_numpy(success)}
        if terms is not None:
            info["reward_terms"] = {k: torch.from_numpy(v) for k, v in terms.items()}
        if done.any():
            final = {k: torch.from_numpy(np.where(_rows(done, v), final_bufs[k], v)) for k, v in obs_bufs.items()}
            final[TASK] = list(final_instructions if final_instructions is not None else self._instructions)
            info["final_obs"] = final
            info["done"] = torch.from_numpy(done)
            info["episode"] = {
                "return": torch.from_numpy(self._ep_return.astype(np.float32)),
                "length": torch.from_numpy(self._ep_len.copy()),
                "success": info["success"],
            }
            if TASK_INDEX in final:  # multi-task envs: the task each ended episode played
                info["episode"]["task_index"] = final[TASK_INDEX]
            self._ep_return[done] = 0.0
            self._ep_len[done] = 0
        self._last_obs = obs
        return obs, torch.from_numpy(reward), torch.from_numpy(term), torch.from_numpy(trunc), info

    def _check_schedule(
        self, weights: Sequence[float] | np.ndarray | None, plans: dict[int, list[Any]] | None,
    ) -> tuple[np.ndarray | None, dict[int, list[Any]]]:
        """Validate :meth:`VecEnv.schedule_tasks` arguments here, before any worker sees them."""
        if not self.spec.tasks:
            VecEnv.schedule_tasks(self)  # raises: single-task env
        w = None
        if weights is not None:
            w = np.asarray(weights, np.float64)
            if len(w):
                w = check_weights(w, len(self.spec.tasks), self.spec.env_id)
        plans = dict(plans or {})
        bad = [i for i in plans if not 0 <= int(i) < self.num_envs]
        if bad:
            raise EnvError(f"{self.spec.env_id}: task plan for env {bad[0]} out of range (num_envs={self.num_envs})")
        return w, plans

    def _reset_books(self, ids: list[int]) -> None:
        self._ep_return[ids] = 0.0
        self._ep_len[ids] = 0

    def _chunk_steps(
        self,
        ids: list[int],
        reward64: np.ndarray,
        flags: np.ndarray,
        terms: dict[str, np.ndarray],
        texts: dict[tuple[int, int], str],
        obs_bufs: dict[str, np.ndarray],
        final_bufs: dict[str, np.ndarray],
    ) -> ChunkSteps:
        """Episode statistics and instructions of one chunk on the contiguous envs ``ids``.

        ``reward64 [H, n]``, ``flags [3, H, n]`` (terminated, truncated, success) and ``terms`` (name ->
        ``[H, n]``) are the chunk's per-step results, ``texts[h, k]`` the instruction env ``ids[k]`` drew
        when it reset after step ``h``; rows ``ids`` of ``obs_bufs`` / ``final_bufs`` hold the
        observation after the chunk and the final observations.
        """
        horizon, n = reward64.shape
        first = ids[0]
        shape = (horizon, n)
        term, trunc, success = flags
        ended = term | trunc
        rows = slice(first, first + n)
        ep_return, ep_len = self._ep_return[rows], self._ep_len[rows]  # views
        ret, length = np.zeros(shape, np.float32), np.zeros(shape, np.int64)
        final_task = [self._instructions[i] for i in ids]
        seen = np.zeros(n, bool)
        for h in range(horizon):  # step by step, so sums match stepping one action at a time
            ep_return += reward64[h]
            ep_len += 1
            if ended[h].any():
                d = ended[h]
                ret[h, d], length[h, d] = ep_return[d], ep_len[d]
                ep_return[d], ep_len[d] = 0.0, 0
                for k in np.flatnonzero(d):
                    if not seen[k]:
                        final_task[k], seen[k] = self._instructions[first + k], True
                    self._instructions[first + k] = texts[h, int(k)]
        obs: Obs = {k: torch.from_numpy(v[rows].copy()) for k, v in obs_bufs.items()}
        if ended.any():
            final: Obs = {k: torch.from_numpy(v[rows].copy()) for k, v in final_bufs.items()}
        else:  # no env ended: no row of final_obs is valid, so it needs no copy
            final = dict(obs)
        final[TASK] = final_task
        obs[TASK] = [self._instructions[i] for i in ids]
        return ChunkSteps(
            env_ids=list(ids), reward=torch.from_numpy(reward64.astype(np.float32)),
            terminated=torch.from_numpy(term), truncated=torch.from_numpy(trunc), success=torch.from_numpy(success),
            reward_terms={k: torch.from_numpy(v) for k, v in terms.items()},
            episode_return=torch.from_numpy(ret), episode_length=torch.from_numpy(length), final_obs=final, obs=obs,
        )


def _rows(mask: np.ndarray, like: np.ndarray) -> np.ndarray:
    return mask.reshape((-1,) + (1,) * (like.ndim - 1))


def _alloc(spec: EnvSpec, n: int) -> dict[str, np.ndarray]:
    return {k: np.zeros((n, *s.shape), dtype=_np_dtype(s.dtype)) for k, s in spec.observation.items()}


def _np_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty((), dtype=dtype).numpy().dtype


class SerialVecEnv(_Bookkeeping):
    """All envs in this process, stepped one after another."""

    def __init__(self, factories: Sequence[EnvFactory], env_id: str) -> None:
        self._envs = [f() for f in factories]
        spec = replace(self._envs[0].spec, env_id=env_id)
        self._init_books(spec, len(self._envs))
        self._obs = _alloc(spec, self.num_envs)
        self._final = _alloc(spec, self.num_envs)
        self._final_instructions = [""] * self.num_envs

    def reset(self, seed: int | Sequence[int] | None = None, env_ids: Sequence[int] | torch.Tensor | None = None) -> Obs:
        ids = normalize_env_ids(env_ids, self.num_envs)
        seed = self._take_seed(seed)
        # The returned batch shares memory with self._obs: never write into it, write a copy.
        self._obs = {k: v.copy() for k, v in self._obs.items()}
        for i, s in zip(ids, seeds_for_ids(seed, ids)):
            obs, self._instructions[i] = self._envs[i].reset(s)
            _write(self._obs, i, obs)
        self._reset_books(ids)
        self._last_obs = self._share(self._obs)
        return self._last_obs

    def _share(self, bufs: dict[str, np.ndarray]) -> Obs:
        obs: Obs = {k: torch.from_numpy(v) for k, v in bufs.items()}
        obs[TASK] = list(self._instructions)
        return obs

    def step(self, actions: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        acts = self.check_actions(actions).numpy()
        n = self.num_envs
        # Every row is written below, straight into fresh arrays the returned tensors then own.
        new = {k: np.empty_like(v) for k, v in self._obs.items()}
        reward = np.empty(n, np.float32)
        term, trunc, success = np.empty((3, n), bool)
        outs = []
        final_instructions = None
        for i, env in enumerate(self._envs):
            out = env.step(acts[i])
            _write(new, i, out.obs)
            reward[i], term[i], trunc[i], success[i] = out.reward, out.terminated, out.truncated, out.success
            if out.terminated or out.truncated:
                if final_instructions is None:
                    final_instructions = list(self._instructions)
                _write(self._final, i, out.obs)
                obs, self._instructions[i] = env.reset(None)
                _write(new, i, obs)
            outs.append(out)
        self._obs = new
        names = outs[0].reward_terms if outs else None
        terms = None
        if names is not None:
            table = np.array([[o.reward_terms[k] for o in outs] for k in names], dtype=np.float32).reshape(-1, n)
            terms = dict(zip(names, table))
        return self._finish_step(reward, term, trunc, success, terms, self._share(new), new, self._final,
                                 final_instructions)

    def step_chunk(self, actions: torch.Tensor, record_obs: bool = False) -> ChunkSteps:
        """Run ``actions [B, H, A]`` with :func:`run_chunk` (see :meth:`VecEnv.step_chunk`).

        With ``record_obs`` (every step rendered and returned) this is the step-by-step default.
        """
        if record_obs:
            return super().step_chunk(actions, record_obs=True)
        acts = self._check_chunk(actions).numpy()
        self._obs = {k: v.copy() for k, v in self._obs.items()}  # returned batches share the old arrays
        reward, flags, terms, texts = run_chunk(self._envs, acts, self._obs, self._final, 0)
        steps = self._chunk_steps(list(range(self.num_envs)), reward, flags, terms,
                                  {(h, j): t for h, j, t in texts}, self._obs, self._final)
        self._last_obs = self._share(self._obs)
        return steps

    def expert_actions(self) -> torch.Tensor:
        """Scripted-expert actions ``[B, A]`` from privileged state."""
        return torch.from_numpy(np.stack([e.expert_action() for e in self._envs]).astype(np.float32))

    def schedule_tasks(self, weights: Sequence[float] | np.ndarray | None = None,
                       plans: dict[int, list[Any]] | None = None) -> None:
        """See :meth:`VecEnv.schedule_tasks`."""
        w, plans = self._check_schedule(weights, plans)
        for i, env in enumerate(self._envs):
            env.schedule_tasks(w, plans.get(i))

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        for e in self._envs:
            e.close()


def _write(bufs: dict[str, np.ndarray], row: int, obs: dict[str, np.ndarray]) -> None:
    for k, buf in bufs.items():
        buf[row] = obs[k]


def run_chunk(
    envs: Sequence[SingleEnv], actions: np.ndarray, obs_bufs: dict[str, np.ndarray],
    final_bufs: dict[str, np.ndarray], offset: int,
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], list[tuple[int, int, str]]]:
    """Execute ``actions [n, H, A]`` on ``envs`` (rows ``offset...`` of the buffers); see :class:`ChunkSteps`.

    Steps before the last are :meth:`SingleEnv.step_unrendered`. An env whose episode ends is
    auto-reset and held still for the rest of the chunk (:class:`sim.chunk.ChunkHold`); its first final
    observation goes to ``final_bufs``, the observation after the chunk to ``obs_bufs``.

    Returns:
        ``(reward float64 [H, n], flags bool [3, H, n] = terminated, truncated, success,
        reward terms name -> float32 [H, n], [(h, j, instruction) of every reset])``.
    """
    n, horizon = actions.shape[:2]
    reward = np.zeros((horizon, n), np.float64)
    flags = np.zeros((3, horizon, n), bool)
    terms: dict[str, np.ndarray] = {}
    texts: list[tuple[int, int, str]] = []
    hold = ChunkHold(n)
    for h in range(horizon):
        last = h == horizon - 1
        step_actions = hold.actions(actions[:, h])
        for j, env in enumerate(envs):
            out = env.step(step_actions[j]) if last else env.step_unrendered(step_actions[j])
            reward[h, j] = out.reward
            flags[:, h, j] = out.terminated, out.truncated, out.success
            for name, value in (out.reward_terms or {}).items():
                if name not in terms:
                    terms[name] = np.zeros((horizon, n), np.float32)
                terms[name][h, j] = value
            obs = out.obs
            if out.terminated or out.truncated:
                if not hold.ended[j]:
                    _write(final_bufs, offset + j, obs)
                obs, text = env.reset(None)
                texts.append((h, j, text))
            if last:
                _write(obs_bufs, offset + j, obs)
        hold.end(flags[0, h] | flags[1, h])
    return reward, flags, terms, texts
