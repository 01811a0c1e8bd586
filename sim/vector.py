"""Batch :class:`sim.single.SingleEnv` instances into a :class:`sim.core.VecEnv`.

Two drivers share one bookkeeping base:

- :class:`SerialVecEnv` steps all envs in this process (fast tasks, tests);
- :class:`ProcessVecEnv` spreads envs over worker processes started with the
  ``forkserver`` (or ``spawn``) context, so simulators and renderers are
  always created inside a fresh worker, never before a fork. Observations
  travel through shared memory; the pipes carry only actions and scalars.

Both auto-reset ended envs, keep the ended episode's final observation, track
episode return/length/success and check action shapes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
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
