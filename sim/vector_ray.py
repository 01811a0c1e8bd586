"""Env workers as Ray actors: :class:`RayVecEnv` (``--env.executor ray``), the same contract as the process workers.

The envs are split into contiguous slices, one per actor, as :class:`sim.vector_process.ProcessVecEnv` splits them
over worker processes; each actor builds its envs from the same factories and runs whole chunks with the same
:func:`sim.vector.run_chunk` (a single step is a chunk of one), so for the same seeds and actions both executors
produce the same episodes. Observations travel through Ray's object store instead of shared memory: on one machine
that costs more than the process executor's pipes (docs/results.md, "Scaling"); its point is placement on a
cluster the user started with ``ray start`` (``RAY_ADDRESS``), next to the learner's GPUs or on CPU-only nodes.

Ray is an optional extra (``pip install 'vla-rl[ray]'``); it is imported only when this executor is chosen. Without
a running cluster, :class:`RayVecEnv` starts a local one sized to the machine (no dashboard). A dead actor (its
process killed, its node lost) is an :class:`sim.core.EnvError` naming the worker and its env indices, never a hang.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from sim.core import ChunkSteps, EnvError, Obs, normalize_env_ids, seeds_for_ids
from sim.single import SingleEnv
from sim.vector import EnvFactory, _alloc, _Bookkeeping, run_chunk


class EnvActor:
    """The envs of one slice, inside a Ray actor process (numpy in, numpy out)."""

    def __init__(self, factories: list[EnvFactory]) -> None:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        torch.set_num_threads(1)
        self.envs: list[SingleEnv] = [f() for f in factories]
        self.obs = _alloc(self.envs[0].spec, len(self.envs))
        self.final = _alloc(self.envs[0].spec, len(self.envs))

    def spec(self) -> Any:
        return self.envs[0].spec

    def reset(self, pairs: list[tuple[int, int | None]]) -> tuple[dict[str, np.ndarray], list[tuple[int, str]]]:
        texts = []
        for j, seed in pairs:
            obs, text = self.envs[j].reset(seed)
            for k, buf in self.obs.items():
                buf[j] = obs[k]
            texts.append((j, text))
        return self.obs, texts

    def chunk(self, actions: np.ndarray) -> tuple[Any, ...]:
        """:func:`run_chunk` on ``actions [n, H, A]``: per-step results, then the obs and final obs of the slice."""
        reward, flags, terms, signals, texts = run_chunk(self.envs, actions, self.obs, self.final, 0)
        return reward, flags, terms, signals, texts, self.obs, self.final

    def expert(self) -> list[np.ndarray]:
        return [e.expert_action() for e in self.envs]

    def close(self) -> None:
        for e in self.envs:
            e.close()


class RayVecEnv(_Bookkeeping):
    """Envs spread over ``num_workers`` Ray actors (contiguous slices); see the module doc.

    Args:
        factories: one picklable zero-argument factory per env (called inside the actors).
        env_id: the full env id reported in the spec and in errors.
        num_workers: actors; envs are split into contiguous slices.
        timeout_s: longest wait for one reply before an :class:`EnvError` (a stuck simulator, a lost node).
    """

    def __init__(self, factories: Sequence[EnvFactory], env_id: str, num_workers: int, timeout_s: float = 600.0) -> None:
        try:
            import ray
        except ImportError:
            raise EnvError(f"{env_id}: env.executor=ray needs Ray: pip install 'vla-rl[ray]'") from None
        if num_workers < 1:
            raise EnvError(f"{env_id}: env.executor=ray needs env.num_workers >= 1 (actors), got {num_workers}")
        self._ray = ray
        self._env_id = env_id
        self._timeout = timeout_s
        self._actors: list[Any] = []
        n = len(factories)
        num_workers = min(num_workers, n)
        bounds = np.linspace(0, n, num_workers + 1).astype(int)
        self._slices = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        self._closed = False
        if not ray.is_initialized():  # a cluster from `ray start` (RAY_ADDRESS) or a local one
            ray.init(address=os.environ.get("RAY_ADDRESS") or None, include_dashboard=False, log_to_driver=False)
        actor_cls = ray.remote(num_cpus=1)(EnvActor)
        try:
            self._actors = [actor_cls.remote(list(factories[a:b])) for a, b in self._slices]
            spec = self._get([a.spec.remote() for a in self._actors], "start")[0]
        except BaseException:
            self.close()
            raise
        self._init_books(replace(spec, env_id=env_id), n)
        self._obs = _alloc(self.spec, n)
        self._final = _alloc(self.spec, n)

    def _get(self, refs: list[Any], what: str, workers: Sequence[int] | None = None) -> list[Any]:
        """``ray.get`` of one reply per worker in ``workers``; a dead or silent actor is an EnvError naming its envs."""
        ray = self._ray
        workers = list(range(len(refs))) if workers is None else list(workers)
        out = []
        for w, ref in zip(workers, refs):
            a, b = self._slices[w]
            try:
                out.append(ray.get(ref, timeout=self._timeout))
            except ray.exceptions.GetTimeoutError:
                raise EnvError(f"{self._env_id}: Ray env worker {w} (envs {a}-{b - 1}) did not answer {what} "
                               f"within {self._timeout:.0f}s") from None
            except ray.exceptions.RayActorError as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise EnvError(f"{self._env_id}: Ray env worker {w} (envs {a}-{b - 1}) died during {what}: "
                               f"{first}") from None
            except ray.exceptions.RayTaskError as exc:
                raise EnvError(f"{self._env_id}: Ray env worker {w} (envs {a}-{b - 1}) failed during {what}: "
                               f"{exc.cause!r}") from None
        return out

    def reset(self, seed: int | Sequence[int] | None = None, env_ids: Sequence[int] | torch.Tensor | None = None) -> Obs:
        ids = normalize_env_ids(env_ids, self.num_envs)
        seeds = seeds_for_ids(self._take_seed(seed), ids)
        busy, refs = [], []
        for w, (a, b) in enumerate(self._slices):
            mine = [(i - a, s) for i, s in zip(ids, seeds) if a <= i < b]
            if mine:
                busy.append(w)
                refs.append(self._actors[w].reset.remote(mine))
        self._obs = {k: v.copy() for k, v in self._obs.items()}  # returned batches share the old arrays
        for w, (obs, texts) in zip(busy, self._get(refs, "reset", busy)):
            a, b = self._slices[w]
            for k, buf in self._obs.items():
                buf[a:b] = obs[k]
            for j, text in texts:
                self._instructions[a + j] = text
        self._reset_books(ids)
        self._last_obs = self._batch(self._obs)
        return self._last_obs

    def _run(self, acts: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray],
                                                         dict[str, np.ndarray], dict]:
        """Run ``acts [B, H, A]`` on every actor; gather per-step results ``[H, B]`` (reward, flags, reward terms,
        privileged signals, new instructions) and the obs / final obs."""
        refs = [actor.chunk.remote(acts[a:b]) for actor, (a, b) in zip(self._actors, self._slices)]
        horizon, n = acts.shape[1], self.num_envs
        reward = np.zeros((horizon, n), np.float64)
        flags = np.zeros((3, horizon, n), bool)
        terms: dict[str, np.ndarray] = {}
        signals: dict[str, np.ndarray] = {}
        texts: dict[tuple[int, int], str] = {}
        self._obs = {k: v.copy() for k, v in self._obs.items()}
        for w, (r, f, t, sg, tx, obs, final) in enumerate(self._get(refs, what)):
            a, b = self._slices[w]
            reward[:, a:b], flags[:, :, a:b] = r, f
            for name, v in t.items():
                terms.setdefault(name, np.zeros((horizon, n), np.float32))[:, a:b] = v
            for name, v in sg.items():
                signals.setdefault(name, np.zeros((horizon, n), np.float32))[:, a:b] = v
            for h, j, text in tx:
                texts[h, a + j] = text
            for k in self._obs:
                self._obs[k][a:b], self._final[k][a:b] = obs[k], final[k]
        return reward, flags, terms, signals, texts

    def step(self, actions: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        acts = self.check_actions(actions).numpy()[:, None]
        before = list(self._instructions)
        reward, flags, terms, signals, texts = self._run(acts, "step")
        for (_, i), text in texts.items():
            self._instructions[i] = text
        term, trunc, success = flags[:, 0]
        return self._finish_step(reward[0].astype(np.float32), term.copy(), trunc.copy(), success.copy(),
                                 {k: v[0].copy() for k, v in terms.items()} or None,
                                 {k: v[0].copy() for k, v in signals.items()} or None, self._batch(self._obs),
                                 self._obs, self._final, before if texts else None)

    def step_chunk(self, actions: torch.Tensor, record_obs: bool = False) -> ChunkSteps:
        """Every actor runs its slice of ``actions [B, H, A]`` with :func:`run_chunk` (see :meth:`VecEnv.step_chunk`)."""
        if record_obs:
            return super().step_chunk(actions, record_obs=True)
        reward, flags, terms, signals, texts = self._run(self._check_chunk(actions).numpy(), "step_chunk")
        steps = self._chunk_steps(list(range(self.num_envs)), reward, flags, terms, signals, texts, self._obs,
                                  self._final)
        self._last_obs = steps.obs
        return steps

    def expert_actions(self) -> torch.Tensor:
        """Scripted-expert actions ``[B, A]`` computed inside the actors."""
        acts = [a for part in self._get([x.expert.remote() for x in self._actors], "expert_actions") for a in part]
        return torch.from_numpy(np.stack(acts).astype(np.float32))

    def close(self) -> None:
        if not getattr(self, "_actors", None):
            return
        self._closed = True
        ray = self._ray
        for actor in self._actors:
            try:
                ray.get(actor.close.remote(), timeout=30)
            except Exception:
                pass
            ray.kill(actor)
        self._actors = []
