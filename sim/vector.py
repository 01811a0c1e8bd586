"""Batch :class:`sim.single.SingleEnv` instances into a :class:`sim.core.VecEnv`.

Two drivers share one bookkeeping base:

- :class:`SerialVecEnv` steps all envs in this process (fast tasks, tests);
- :class:`ProcessVecEnv` spreads envs over worker processes started with the
  ``forkserver`` (or ``spawn``) context, so simulators and renderers are
  always created inside a fresh worker, never before a fork. Observations
  travel through shared memory; the pipes carry only actions and scalars.

Both auto-reset ended envs, keep the ended episode's final observation, track
episode return/length/success and check action shapes.

:class:`ProcessVecEnv` also runs whole action chunks asynchronously on a
group of workers (:meth:`ProcessVecEnv.chunk_async` /
:meth:`ProcessVecEnv.chunk_wait`), so a caller can compute the next chunk of
one group of envs while another group steps (pipelined rollouts). Inside a
chunk an env whose episode ends is auto-reset and then held still (zero
actions) for the rest of the chunk, exactly as the rollout engine does with
:meth:`VecEnv.step`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.multiprocessing  # noqa: F401  (registers tensor sharing over pipes)

from sim.core import TASK, EnvError, EnvSpec, Obs, VecEnv, normalize_env_ids, seeds_for_ids
from sim.single import SingleEnv, StepOut

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
        self, outs: list[StepOut], obs_bufs: dict[str, np.ndarray], final_bufs: dict[str, np.ndarray]
    ) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        reward = np.array([o.reward for o in outs], dtype=np.float32)
        term = np.array([o.terminated for o in outs], dtype=bool)
        trunc = np.array([o.truncated for o in outs], dtype=bool)
        success = np.array([o.success for o in outs], dtype=bool)
        self._ep_return += reward
        self._ep_len += 1
        done = term | trunc
        info: dict[str, Any] = {"success": torch.from_numpy(success)}
        if outs and outs[0].reward_terms is not None:
            info["reward_terms"] = {
                k: torch.tensor([o.reward_terms[k] for o in outs], dtype=torch.float32) for k in outs[0].reward_terms
            }
        obs = self._batch(obs_bufs)
        if done.any():
            final = {k: torch.from_numpy(np.where(_rows(done, v), final_bufs[k], v)) for k, v in obs_bufs.items()}
            final[TASK] = list(self._final_instructions)
            info["final_obs"] = final
            info["done"] = torch.from_numpy(done)
            info["episode"] = {
                "return": torch.from_numpy(self._ep_return.astype(np.float32)),
                "length": torch.from_numpy(self._ep_len.copy()),
                "success": torch.from_numpy(success),
            }
            self._ep_return[done] = 0.0
            self._ep_len[done] = 0
        self._last_obs = obs
        return obs, torch.from_numpy(reward), torch.from_numpy(term), torch.from_numpy(trunc), info

    def _reset_books(self, ids: list[int]) -> None:
        self._ep_return[ids] = 0.0
        self._ep_len[ids] = 0


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
        for i, s in zip(ids, seeds_for_ids(seed, ids)):
            obs, self._instructions[i] = self._envs[i].reset(s)
            _write(self._obs, i, obs)
        self._reset_books(ids)
        self._last_obs = self._batch(self._obs)
        return self._last_obs

    def step(self, actions: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        acts = self.check_actions(actions).numpy()
        outs = []
        self._final_instructions = list(self._instructions)
        for i, env in enumerate(self._envs):
            out = env.step(acts[i])
            _write(self._obs, i, out.obs)
            if out.terminated or out.truncated:
                _write(self._final, i, out.obs)
                obs, self._instructions[i] = env.reset(None)
                _write(self._obs, i, obs)
            outs.append(out)
        return self._finish_step(outs, self._obs, self._final)

    def expert_actions(self) -> torch.Tensor:
        """Scripted-expert actions ``[B, A]`` from privileged state."""
        return torch.from_numpy(np.stack([e.expert_action() for e in self._envs]).astype(np.float32))

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        for e in self._envs:
            e.close()


def _write(bufs: dict[str, np.ndarray], row: int, obs: dict[str, np.ndarray]) -> None:
    for k, buf in bufs.items():
        buf[row] = obs[k]


# ---------------------------------------------------------------- processes


def _shared_buffers(spec: EnvSpec, n: int) -> dict[str, torch.Tensor]:
    """Observation buffers ``[n, ...]`` in shared memory (sent to workers over their pipe)."""
    return {k: torch.zeros((n, *s.shape), dtype=s.dtype).share_memory_() for k, s in spec.observation.items()}


def _numpy_views(bufs: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in bufs.items()}


def _worker(conn: Any, factories: list[EnvFactory], offset: int, n: int) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    envs: list[SingleEnv] = []
    try:
        envs = [f() for f in factories]
        spec = envs[0].spec
        conn.send(("ok", spec))
        obs_bufs, final_bufs = (_numpy_views(b) for b in conn.recv())
        while True:
            cmd, arg = conn.recv()
            if cmd == "step":
                outs, instr = [], []
                for j, env in enumerate(envs):
                    out = env.step(arg[j])
                    row = offset + j
                    _write(obs_bufs, row, out.obs)
                    text = None
                    if out.terminated or out.truncated:
                        _write(final_bufs, row, out.obs)
                        obs, text = env.reset(None)
                        _write(obs_bufs, row, obs)
                    outs.append(StepOut({}, out.reward, out.terminated, out.truncated, out.success, out.reward_terms))
                    instr.append(text)
                conn.send(("ok", (outs, instr)))
            elif cmd == "chunk":  # arg: actions [n, H, A]; hold an env still after its episode ends
                steps, ended = [], [False] * len(envs)
                for h in range(arg.shape[1]):
                    outs, instr = [], []
                    for j, env in enumerate(envs):
                        out = env.step(np.zeros_like(arg[j, h]) if ended[j] else arg[j, h])
                        row = offset + j
                        _write(obs_bufs, row, out.obs)
                        text = None
                        if out.terminated or out.truncated:
                            if not ended[j]:
                                _write(final_bufs, row, out.obs)
                            ended[j] = True
                            obs, text = env.reset(None)
                            _write(obs_bufs, row, obs)
                        outs.append(StepOut({}, out.reward, out.terminated, out.truncated, out.success,
                                            out.reward_terms))
                        instr.append(text)
                    steps.append((outs, instr))
                conn.send(("ok", steps))
            elif cmd == "reset":
                texts = []
                for j, seed in arg:
                    obs, text = envs[j].reset(seed)
                    _write(obs_bufs, offset + j, obs)
                    texts.append((j, text))
                conn.send(("ok", texts))
            elif cmd == "expert":
                conn.send(("ok", [e.expert_action() for e in envs]))
            elif cmd == "close":
                break
    except (KeyboardInterrupt, EOFError):
        pass
    except BaseException as exc:  # report to the parent instead of dying silently
        try:
            conn.send(("error", (f"{type(exc).__name__}: {exc}", traceback.format_exc())))
        except Exception:
            pass
    finally:
        for e in envs:
            try:
                e.close()
            except Exception:
                pass
        try:
            conn.send(("closed", None))
        except Exception:
            pass


@dataclass
class ChunkSteps:
    """The outcome of one action chunk on a group of ``n`` envs (:meth:`ProcessVecEnv.chunk_wait`).

    Per-step tensors are ``[H, n]``; rows follow ``env_ids``. After an env's episode ends (and it is
    auto-reset) it is held still: its later steps belong to its next episode.

    Attributes:
        env_ids: the envs of the group, ascending.
        reward, terminated, truncated, success: ``[H, n]`` per step, as :meth:`VecEnv.step` returns them.
        reward_terms: named ``[H, n]`` reward terms (empty if the env reports none).
        episode_return, episode_length: ``[H, n]`` statistics of the episode that ended at that step
            (valid where ``terminated | truncated``).
        final_obs: rows ``[n, ...]`` of the last observation of each env's first episode that ended in
            the chunk (valid for those envs), with ``task`` its instruction.
        obs: rows ``[n, ...]`` of the observation after the chunk, with the current instructions.
    """

    env_ids: list[int]
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    success: torch.Tensor
    reward_terms: dict[str, torch.Tensor]
    episode_return: torch.Tensor
    episode_length: torch.Tensor
    final_obs: Obs
    obs: Obs


class ProcessVecEnv(_Bookkeeping):
    """Envs spread over ``num_workers`` worker processes (contiguous slices).

    Args:
        factories: one picklable zero-argument factory per env.
        env_id: the full env id reported in the spec and in errors.
        num_workers: worker processes; envs are split into contiguous slices.
        context: ``forkserver`` (default) or ``spawn``; ``fork`` is refused
            because renderers hang after a fork.
    """

    def __init__(
        self,
        factories: Sequence[EnvFactory],
        env_id: str,
        num_workers: int,
        context: str = "forkserver",
        start_timeout: float = 300.0,
    ) -> None:
        if context == "fork":
            raise EnvError("ProcessVecEnv: the 'fork' context hangs renderers; use 'forkserver' or 'spawn'")
        n = len(factories)
        num_workers = max(1, min(num_workers, n))
        self.num_envs = n
        self._env_id = env_id
        self._final_instructions = [""] * n
        ctx = mp.get_context(context)
        bounds = np.linspace(0, n, num_workers + 1).astype(int)
        self._slices = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        self._conns, self._procs = [], []
        self._pending: dict[int, int] = {}  # worker -> chunk length, for chunks in flight
        try:
            for a, b in self._slices:
                parent, child = ctx.Pipe()
                p = ctx.Process(
                    target=_worker,
                    args=(child, list(factories[a:b]), a, n),
                    daemon=True,
                )
                p.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(p)
            specs = [self._recv(w, timeout=start_timeout) for w in range(len(self._conns))]
            self._init_books(replace(specs[0], env_id=env_id), n)
            obs_t, final_t = _shared_buffers(specs[0], n), _shared_buffers(specs[0], n)
            for c in self._conns:
                c.send((obs_t, final_t))
            self._obs_bufs, self._final_bufs = _numpy_views(obs_t), _numpy_views(final_t)
        except BaseException:
            self.close()
            raise

    def _recv(self, w: int, timeout: float | None = None) -> Any:
        conn = self._conns[w]
        if timeout is not None and not conn.poll(timeout):
            raise EnvError(f"{self._env_id}: worker {w} did not answer within {timeout:.0f}s")
        try:
            status, payload = conn.recv()
        except EOFError:
            code = self._procs[w].exitcode
            raise EnvError(f"{self._env_id}: worker {w} died (exit code {code})") from None
        if status == "error":
            msg, tb = payload
            raise EnvError(f"{self._env_id}: worker {w} failed: {msg}\n--- worker traceback ---\n{tb}")
        return payload

    def reset(self, seed: int | Sequence[int] | None = None, env_ids: Sequence[int] | torch.Tensor | None = None) -> Obs:
        self._check_idle("reset")
        ids = normalize_env_ids(env_ids, self.num_envs)
        seeds = seeds_for_ids(self._take_seed(seed), ids)
        busy = []
        for w, (a, b) in enumerate(self._slices):
            mine = [(i - a, s) for i, s in zip(ids, seeds) if a <= i < b]
            if mine:
                self._conns[w].send(("reset", mine))
                busy.append(w)
        for w in busy:
            for j, text in self._recv(w):
                self._instructions[self._slices[w][0] + j] = text
        self._reset_books(ids)
        self._last_obs = self._batch(self._obs_bufs)
        return self._last_obs

    def step(self, actions: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        self._check_idle("step")
        acts = self.check_actions(actions).numpy()
        for w, (a, b) in enumerate(self._slices):
            self._conns[w].send(("step", acts[a:b]))
        outs: list[StepOut] = []
        self._final_instructions = list(self._instructions)
        for w, (a, _) in enumerate(self._slices):
            w_outs, texts = self._recv(w)
            outs.extend(w_outs)
            for j, text in enumerate(texts):
                if text is not None:
                    self._instructions[a + j] = text
        return self._finish_step(outs, self._obs_bufs, self._final_bufs)

    # -- asynchronous action chunks (pipelined rollouts) -----------------------------------------

    def chunk_groups(self, num_groups: int = 2) -> list[list[int]] | None:
        """Env ids split into ``num_groups`` groups of whole workers (contiguous, ascending).

        Groups step in parallel with each other and with the caller. Returns None when there are
        fewer workers than groups (nothing could overlap).
        """
        if num_groups < 1 or len(self._slices) < num_groups:
            return None
        bounds = np.linspace(0, len(self._slices), num_groups + 1).astype(int)
        return [list(range(self._slices[a][0], self._slices[b - 1][1])) for a, b in zip(bounds[:-1], bounds[1:])]

    def _workers_of(self, env_ids: Sequence[int]) -> list[int]:
        ids = list(env_ids)
        workers = [w for w, (a, b) in enumerate(self._slices) if a < b and a in ids]
        covered = [i for w in workers for i in range(*self._slices[w])]
        if not ids or covered != ids:
            raise EnvError(
                f"{self._env_id}: chunk env_ids {ids[:8]}... must be whole worker slices in order "
                f"(worker slices {self._slices}); use chunk_groups() to get valid groups"
            )
        return workers

    def _check_idle(self, what: str) -> None:
        if self._pending:
            raise EnvError(f"{self._env_id}: {what}() while action chunks are in flight on workers "
                           f"{sorted(self._pending)}; call chunk_wait() first")

    def chunk_async(self, actions: torch.Tensor, env_ids: Sequence[int]) -> None:
        """Start executing ``actions [n, H, A]`` on the envs ``env_ids`` (whole workers, see :meth:`chunk_groups`).

        Returns at once; :meth:`chunk_wait` with the same ids collects the outcome. An env whose episode
        ends inside the chunk is auto-reset and held still (zero actions) for the rest of the chunk.

        Raises:
            EnvError: for ids that are not whole worker slices, a group already in flight, or a wrong
                action shape.
        """
        workers = self._workers_of(env_ids)
        busy = [w for w in workers if w in self._pending]
        if busy:
            raise EnvError(f"{self._env_id}: workers {busy} already run a chunk; call chunk_wait() first")
        if not isinstance(actions, torch.Tensor) or actions.ndim != 3 or tuple(actions.shape[::2]) != (
                len(env_ids), *self.spec.action.shape):
            shape = list(actions.shape) if isinstance(actions, torch.Tensor) else type(actions).__name__
            raise EnvError(f"{self._env_id}: chunk actions must be [n_envs={len(env_ids)}, H, "
                           f"{self.spec.action_dim}], got {shape}")
        acts = actions.detach().to("cpu", torch.float32).numpy()
        first = env_ids[0]
        for w in workers:
            a, b = self._slices[w]
            self._conns[w].send(("chunk", acts[a - first : b - first]))
            self._pending[w] = acts.shape[1]

    def chunk_wait(self, env_ids: Sequence[int]) -> ChunkSteps:
        """Wait for the chunk started by :meth:`chunk_async` on ``env_ids``; see :class:`ChunkSteps`.

        Raises:
            EnvError: if no chunk runs on those envs, or a worker failed or died.
        """
        workers = self._workers_of(env_ids)
        if any(w not in self._pending for w in workers):
            raise EnvError(f"{self._env_id}: no chunk in flight on env_ids {list(env_ids)[:8]}...")
        per_worker = []
        for w in workers:
            horizon = self._pending.pop(w)
            per_worker.append(self._recv(w))
        ids = list(env_ids)
        n, first = len(ids), ids[0]
        shape = (horizon, n)
        reward, ret = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        term, trunc, success = np.zeros(shape, bool), np.zeros(shape, bool), np.zeros(shape, bool)
        length = np.zeros(shape, np.int64)
        terms: dict[str, np.ndarray] = {}
        final_task = [self._instructions[i] for i in ids]
        seen = np.zeros(n, bool)
        for w, steps in zip(workers, per_worker):
            a = self._slices[w][0]
            for h, (outs, texts) in enumerate(steps):
                for j, (out, text) in enumerate(zip(outs, texts)):
                    i, k = a + j, a + j - first
                    reward[h, k], term[h, k], trunc[h, k] = out.reward, out.terminated, out.truncated
                    success[h, k] = out.success
                    for name, value in (out.reward_terms or {}).items():
                        terms.setdefault(name, np.zeros(shape, np.float32))[h, k] = value
                    self._ep_return[i] += out.reward
                    self._ep_len[i] += 1
                    if out.terminated or out.truncated:
                        ret[h, k], length[h, k] = self._ep_return[i], self._ep_len[i]
                        self._ep_return[i], self._ep_len[i] = 0.0, 0
                        if not seen[k]:
                            final_task[k], seen[k] = self._instructions[i], True
                    if text is not None:
                        self._instructions[i] = text
        rows = slice(first, first + n)
        final: Obs = {k: torch.from_numpy(v[rows].copy()) for k, v in self._final_bufs.items()}
        final[TASK] = final_task
        obs: Obs = {k: torch.from_numpy(v[rows].copy()) for k, v in self._obs_bufs.items()}
        obs[TASK] = [self._instructions[i] for i in ids]
        return ChunkSteps(
            env_ids=ids, reward=torch.from_numpy(reward), terminated=torch.from_numpy(term),
            truncated=torch.from_numpy(trunc), success=torch.from_numpy(success),
            reward_terms={k: torch.from_numpy(v) for k, v in terms.items()},
            episode_return=torch.from_numpy(ret), episode_length=torch.from_numpy(length), final_obs=final, obs=obs,
        )

    def expert_actions(self) -> torch.Tensor:
        """Scripted-expert actions ``[B, A]`` computed inside the workers."""
        for c in self._conns:
            c.send(("expert", None))
        acts = [a for w in range(len(self._conns)) for a in self._recv(w)]
        return torch.from_numpy(np.stack(acts).astype(np.float32))

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        for c in getattr(self, "_conns", []):
            try:
                c.send(("close", None))
            except Exception:
                pass
        for p in getattr(self, "_procs", []):
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for c in getattr(self, "_conns", []):
            c.close()


def build_vec_env(factories: Sequence[EnvFactory], env_id: str, num_workers: int, context: str = "forkserver") -> VecEnv:
    """``SerialVecEnv`` when ``num_workers == 0``, else ``ProcessVecEnv``."""
    if num_workers <= 0:
        return SerialVecEnv(factories, env_id)
    return ProcessVecEnv(factories, env_id, num_workers, context)
