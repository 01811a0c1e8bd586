"""Worker-process vectorization: :class:`ProcessVecEnv` (see :mod:`sim.vector` for the shared contract).

Envs are spread over worker processes in contiguous slices; observations,
actions and per-step scalars live in shared memory and the pipes carry one
byte per step each way. Whole action chunks can run asynchronously on a group
of workers (:meth:`ProcessVecEnv.chunk_async` / :meth:`ProcessVecEnv.chunk_wait`);
a chunk's actions and per-step results travel through per-worker shared chunk
buffers, so a chunk costs a five-byte message and a one-byte reply (pickled
news only when an env reset or reported new reward-term or signal names). Named reward terms and
privileged signals (:class:`sim.single.StepOut`) are two *channels* of named float32 scalars with the
same transport: each name owns a slot (a row) of that channel's shared buffer.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import select
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.multiprocessing  # noqa: F401  (registers tensor sharing over pipes)

from sim.core import ChunkSteps, EnvConfigError, EnvError, EnvSpec, Obs, normalize_env_ids, seeds_for_ids
from sim.single import SingleEnv
from sim.vector import EnvFactory, _Bookkeeping, _write, run_chunk

MAX_REWARD_TERMS = 32  # named reward terms (and, separately, signals) per env that fit the shared step buffers
CHANNELS = ("terms", "signals")  # named scalar channels: StepOut.reward_terms, StepOut.signals
_STEP = b"s"  # parent -> worker: step with the actions in the shared action buffer
_CHUNK = b"c"  # parent -> worker, + horizon (4 bytes): run the chunk in the worker's shared chunk buffers
_DONE = b"k"  # worker -> parent: step or chunk done, results in shared memory, no instruction or term-name news


def _shared_buffers(spec: EnvSpec, n: int) -> dict[str, torch.Tensor]:
    """Observation buffers ``[n, ...]`` in shared memory (sent to workers over their pipe)."""
    return {k: torch.zeros((n, *s.shape), dtype=s.dtype).share_memory_() for k, s in spec.observation.items()}


def _step_buffers(spec: EnvSpec, n: int) -> dict[str, torch.Tensor]:
    """Shared per-step buffers: actions in, scalars out (rows = env ids; ``flags`` = term, trunc, success)."""
    return {
        "actions": torch.zeros((n, *spec.action.shape), dtype=torch.float32).share_memory_(),
        "reward": torch.zeros(n, dtype=torch.float64).share_memory_(),
        "flags": torch.zeros((3, n), dtype=torch.bool).share_memory_(),
        "terms": torch.zeros((MAX_REWARD_TERMS, n), dtype=torch.float32).share_memory_(),
        "signals": torch.zeros((MAX_REWARD_TERMS, n), dtype=torch.float32).share_memory_(),
    }


def _chunk_buffers(spec: EnvSpec, n: int, horizon: int) -> dict[str, torch.Tensor]:
    """One worker's shared chunk buffers for up to ``horizon`` steps on its ``n`` envs (columns = its envs).

    ``actions [n, H, A]`` in; per-step results out: ``reward [H, n]``, ``flags [3, H, n]`` (term, trunc,
    success), ``terms`` and ``signals [MAX_REWARD_TERMS, H, n]`` (rows = the worker's slots).
    """
    return {
        "actions": torch.zeros((n, horizon, *spec.action.shape), dtype=torch.float32).share_memory_(),
        "reward": torch.zeros((horizon, n), dtype=torch.float64).share_memory_(),
        "flags": torch.zeros((3, horizon, n), dtype=torch.bool).share_memory_(),
        "terms": torch.zeros((MAX_REWARD_TERMS, horizon, n), dtype=torch.float32).share_memory_(),
        "signals": torch.zeros((MAX_REWARD_TERMS, horizon, n), dtype=torch.float32).share_memory_(),
    }


class _Waiter:
    """Busy-polls a connection for up to ``spin_s`` before the caller blocks on it.

    Blocking on a pipe costs a scheduler wake-up per message (tens of microseconds in a VM),
    a visible share of a 1-3 ms env step: on 1 worker x 1 MuJoCo env, stepping one action at a
    time went from 0.78-0.82x to 0.96x of the raw simulator (docs/results.md, "Simulator throughput"). The spin
    yields the core at every turn, so a process with work to do is not held up for long; still,
    with more busy processes than cores it costs more than it saves (2 workers + this process on
    2 cores: 0.69x against 0.75x without), so :class:`ProcessVecEnv` spins only when its workers
    and this process fit the usable CPUs.
    """

    def __init__(self, conn: Any, spin_s: float) -> None:
        self.spin_s = spin_s if hasattr(select, "poll") else 0.0  # no poll() on Windows: always sleep
        if self.spin_s > 0:
            self._poll = select.poll()
            self._poll.register(conn.fileno(), select.POLLIN)

    def wait(self) -> None:
        """Return when data is ready or ``spin_s`` has passed (the caller's read then blocks as usual)."""
        if self.spin_s <= 0:
            return
        poll, deadline = self._poll.poll, time.perf_counter() + self.spin_s
        while not poll(0) and time.perf_counter() < deadline:
            os.sched_yield()  # a process that needs this core (another job's, or ours) runs first


def _usable_cpus(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """CPUs this process may run on: its affinity, capped by a cgroup v2 CPU quota (``cpu_max``; containers)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
    try:
        quota, period = Path(cpu_max).read_text().split()[:2]  # "max 100000" or e.g. "150000 100000"
        if quota != "max":
            cpus = min(cpus, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cpus


def _numpy_views(bufs: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in bufs.items()}


class _TermSlots:
    """A worker's names of one channel (reward terms or signals), in first-seen order; each name owns one row
    of the channel's shared buffer."""

    def __init__(self, env_id: str, what: str = "reward terms") -> None:
        self.env_id = env_id
        self.what = what
        self.names: list[str] | None = None  # None until an env reports reward terms
        self._slot: dict[str, int] = {}

    def put(self, out: dict[str, Any], into: np.ndarray, col: int | slice) -> bool:
        """Write ``out`` (name -> value, or array) into ``into[slot, col]``; names not in ``out`` read 0.

        Returns whether new names were added.
        """
        grew = self.names is None
        if grew:
            self.names = []
        names, slot = self.names, self._slot
        if len(out) != len(names) or any(k not in slot for k in out):
            into[: len(names), col] = 0.0
            for k in out:
                if k not in slot:
                    if len(names) >= MAX_REWARD_TERMS:
                        raise EnvError(f"{self.env_id}: more than {MAX_REWARD_TERMS} named {self.what}")
                    slot[k] = len(names)
                    names.append(k)
                    grew = True
        for k, v in out.items():
            into[slot[k], col] = v
        return grew


def _term_layout(per_worker: list[list[str] | None]) -> tuple[list[str] | None, bool]:
    """(union of the workers' reward-term names or None if none reports terms, whether all workers agree)."""
    if all(x is None for x in per_worker):
        return None, True
    union = list(dict.fromkeys(k for x in per_worker for k in x or ()))
    return union, all(x == union for x in per_worker)


def _worker(conn: Any, factories: list[EnvFactory], offset: int, n: int, spin_s: float = 0.0) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    envs: list[SingleEnv] = []
    try:
        envs = [f() for f in factories]
        spec = envs[0].spec
        conn.send(("ok", spec))
        obs_t, final_t, step_t = conn.recv()
        obs_bufs, final_bufs, step_bufs = _numpy_views(obs_t), _numpy_views(final_t), _numpy_views(step_t)
        rows = slice(offset, offset + len(envs))
        act_buf, reward_buf = step_bufs["actions"][rows], step_bufs["reward"]
        flags = step_bufs["flags"]
        slots = {"terms": _TermSlots(spec.env_id), "signals": _TermSlots(spec.env_id, "signals")}
        attrs = {"terms": "reward_terms", "signals": "signals"}
        chunk: dict[str, np.ndarray] = {}  # shared chunk buffers, sent by the parent before the first chunk
        waiter = _Waiter(conn, spin_s)

        def reply(texts: list[tuple[Any, ...]] | None, grew: dict[str, bool]) -> None:
            """One byte, or the instructions of envs that reset and each channel's names when they grew."""
            if texts is None and not any(grew.values()):
                conn.send_bytes(_DONE)
            else:
                names = {c: list(slots[c].names or ()) for c in CHANNELS if grew[c]}
                conn.send(("ok", (texts or [], names)))

        while True:
            waiter.wait()
            msg = conn.recv_bytes()
            if msg == _STEP:  # actions in shared memory; results back in shared memory
                acts = act_buf.copy()
                texts, grew = None, dict.fromkeys(CHANNELS, False)
                for j, env in enumerate(envs):
                    out = env.step(acts[j])
                    row = offset + j
                    _write(obs_bufs, row, out.obs)
                    reward_buf[row] = out.reward
                    flags[0, row], flags[1, row], flags[2, row] = out.terminated, out.truncated, out.success
                    for c in CHANNELS:
                        named, buf = getattr(out, attrs[c]), step_bufs[c]
                        if named is not None:
                            grew[c] |= slots[c].put(named, buf, row)
                        elif slots[c].names:
                            buf[: len(slots[c].names), row] = 0.0
                    if out.terminated or out.truncated:
                        _write(final_bufs, row, out.obs)
                        obs, text = env.reset(None)
                        _write(obs_bufs, row, obs)
                        texts = (texts or []) + [(j, text)]
                reply(texts, grew)
                continue
            if msg[:1] == _CHUNK:  # actions [n, H, A] in the shared chunk buffers; per-step results back there
                horizon = int.from_bytes(msg[1:], "little")
                reward, chunk_flags, terms, signals, chunk_texts = run_chunk(
                    envs, chunk["actions"][:, :horizon].copy(), obs_bufs, final_bufs, offset)
                chunk["reward"][:horizon], chunk["flags"][:, :horizon] = reward, chunk_flags
                grew = dict.fromkeys(CHANNELS, False)
                for c, named in (("terms", terms), ("signals", signals)):
                    if named:
                        grew[c] = slots[c].put(named, chunk[c][:, :horizon], slice(None))
                    elif slots[c].names:
                        chunk[c][: len(slots[c].names), :horizon] = 0.0
                reply(chunk_texts or None, grew)
                continue
            cmd, arg = pickle.loads(msg)
            if cmd == "chunk_buffers":  # arg: this worker's new shared chunk buffers (no reply)
                chunk = _numpy_views(arg)
            elif cmd == "reset":
                texts = []
                for j, seed in arg:
                    obs, text = envs[j].reset(seed)
                    _write(obs_bufs, offset + j, obs)
                    texts.append((j, text))
                conn.send(("ok", texts))
            elif cmd == "expert":
                conn.send(("ok", [e.expert_action() for e in envs]))
            elif cmd == "tasks":  # arg: (weights or None, {local slot: plan})
                weights, plans = arg
                for j, env in enumerate(envs):
                    env.schedule_tasks(weights, plans.get(j))
                conn.send(("ok", None))
            elif cmd == "close":
                break
    except (KeyboardInterrupt, EOFError):
        pass
    except BaseException as exc:  # report to the parent instead of dying silently
        try:
            bad_input = isinstance(exc, EnvConfigError)
            conn.send(("error", (f"{type(exc).__name__}: {exc}", traceback.format_exc(), bad_input)))
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
        spin: busy-poll the pipes briefly instead of sleeping on them at once (see
            :class:`_Waiter`): True, False, or None (default) for "when the workers and
            this process fit the usable CPUs".
    """

    SPIN_PARENT_S = 5e-3  # this process waits for a step's results (a MuJoCo step: 1-3 ms)
    SPIN_WORKER_S = 1e-3  # a worker waits for the next actions (the caller's work between steps)

    def __init__(
        self,
        factories: Sequence[EnvFactory],
        env_id: str,
        num_workers: int,
        context: str = "forkserver",
        start_timeout: float = 300.0,
        spin: bool | None = None,
    ) -> None:
        if context == "fork":
            raise EnvError("ProcessVecEnv: the 'fork' context hangs renderers; use 'forkserver' or 'spawn'")
        n = len(factories)
        num_workers = max(1, min(num_workers, n))
        self.num_envs = n
        self._env_id = env_id
        self._final_instructions = [""] * n
        ctx = mp.get_context(context)
        if spin is None:
            spin = num_workers + 1 <= _usable_cpus()
        self.spin = spin
        bounds = np.linspace(0, n, num_workers + 1).astype(int)
        self._slices = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        self._conns, self._procs = [], []
        self._pending: dict[int, int] = {}  # worker -> chunk length, for chunks in flight
        self._chunk_bufs: list[dict[str, np.ndarray] | None] = [None] * num_workers  # per worker, grown on demand
        try:
            for a, b in self._slices:
                parent, child = ctx.Pipe()
                p = ctx.Process(
                    target=_worker,
                    args=(child, list(factories[a:b]), a, n, self.SPIN_WORKER_S if spin else 0.0),
                    daemon=True,
                )
                p.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(p)
            self._waiters = [_Waiter(c, self.SPIN_PARENT_S if spin else 0.0) for c in self._conns]
            specs = [self._recv(w, timeout=start_timeout) for w in range(len(self._conns))]
            self._init_books(replace(specs[0], env_id=env_id), n)
            obs_t, final_t = _shared_buffers(specs[0], n), _shared_buffers(specs[0], n)
            step_t = _step_buffers(specs[0], n)
            for c in self._conns:
                c.send((obs_t, final_t, step_t))
            self._obs_bufs, self._final_bufs = _numpy_views(obs_t), _numpy_views(final_t)
            self._step_bufs = _numpy_views(step_t)
            # per channel (CHANNELS), each worker's names in slot order (None until it reports some)
            self._names: dict[str, list[list[str] | None]] = {c: [None] * len(self._conns) for c in CHANNELS}
            self._layouts: dict[tuple[str, tuple[int, ...]], tuple[list[str] | None, bool]] = {}  # see _layout
        except BaseException:
            self.close()
            raise

    def _recv(self, w: int, timeout: float | None = None) -> Any:
        conn = self._conns[w]
        self._waiters[w].wait()
        if timeout is not None and not conn.poll(timeout):
            raise EnvError(f"{self._env_id}: worker {w} did not answer within {timeout:.0f}s")
        try:
            msg = conn.recv_bytes()
        except EOFError:
            code = self._procs[w].exitcode
            raise EnvError(f"{self._env_id}: worker {w} died (exit code {code})") from None
        if msg == _DONE:
            return None
        status, payload = pickle.loads(msg)
        if status == "error":
            msg, tb, bad_input = payload
            if bad_input:  # an env id or option the worker's env rejects: the user's input, no traceback needed
                raise EnvConfigError(f"{self._env_id}: worker {w}: {msg.removeprefix('EnvConfigError: ')}")
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
        bufs = self._step_bufs
        bufs["actions"][:] = self.check_actions(actions).numpy()
        for c in self._conns:
            c.send_bytes(_STEP)
        final_instructions = None
        for w, (a, _) in enumerate(self._slices):
            texts = self._recv_news(w)
            if texts and final_instructions is None:
                final_instructions = list(self._instructions)
            for j, text in texts:
                self._instructions[a + j] = text
        reward = bufs["reward"].astype(np.float32)
        term, trunc, success = bufs["flags"].copy()
        return self._finish_step(reward, term, trunc, success, self._named("terms"), self._named("signals"),
                                 self._batch(self._obs_bufs), self._obs_bufs, self._final_bufs, final_instructions)

    def _recv_news(self, w: int) -> list[tuple[Any, ...]]:
        """Wait for worker ``w``'s step or chunk reply; record new term / signal names; return its resets' instructions."""
        news = self._recv(w)
        if news is None:
            return []
        texts, names = news
        for channel, new in names.items():
            self._names[channel][w] = new
            self._layouts.clear()
        return texts

    def _layout(self, channel: str, workers: tuple[int, ...]) -> tuple[list[str] | None, bool]:
        """:func:`_term_layout` of ``workers`` for ``channel``, recomputed only when a worker reports new names."""
        layout = self._layouts.get((channel, workers))
        if layout is None:
            layout = self._layouts[channel, workers] = _term_layout([self._names[channel][w] for w in workers])
        return layout

    def _named(self, channel: str) -> dict[str, np.ndarray] | None:
        """This step's named scalars of ``channel`` ``float32 [B]`` (views of one fresh array), from the shared buffer."""
        names, same = self._layout(channel, tuple(range(len(self._conns))))
        if names is None:
            return None
        buf = self._step_bufs[channel]
        if same:
            return dict(zip(names, buf[: len(names)].copy()))
        table = np.zeros((len(names), self.num_envs), np.float32)
        for w_names, (a, b) in zip(self._names[channel], self._slices):
            for slot, k in enumerate(w_names or ()):
                table[names.index(k), a:b] = buf[slot, a:b]
        return dict(zip(names, table))

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
        if not isinstance(actions, torch.Tensor) or actions.ndim != 3 or tuple(actions.shape[::2]) != (
                len(env_ids), *self.spec.action.shape):
            shape = list(actions.shape) if isinstance(actions, torch.Tensor) else type(actions).__name__
            raise EnvError(f"{self._env_id}: chunk actions must be [n_envs={len(env_ids)}, H, "
                           f"{self.spec.action_dim}], got {shape}")
        self._launch(workers, actions.detach().to("cpu", torch.float32).numpy(), env_ids[0])

    def _launch(self, workers: list[int], acts: np.ndarray, first: int) -> None:
        """Write ``acts [n, H, A]`` (rows from env ``first``) into the workers' chunk buffers and start them."""
        busy = [w for w in workers if w in self._pending]
        if busy:
            raise EnvError(f"{self._env_id}: workers {busy} already run a chunk; call chunk_wait() first")
        horizon = acts.shape[1]
        for w in workers:
            a, b = self._slices[w]
            self._chunk_buffers(w, horizon)["actions"][:, :horizon] = acts[a - first : b - first]
            self._conns[w].send_bytes(_CHUNK + horizon.to_bytes(4, "little"))
            self._pending[w] = horizon

    def _chunk_buffers(self, w: int, horizon: int) -> dict[str, np.ndarray]:
        """Worker ``w``'s shared chunk buffers; replaced by (and sent to the idle worker) larger ones when needed."""
        bufs = self._chunk_bufs[w]
        if bufs is None or bufs["reward"].shape[0] < horizon:
            a, b = self._slices[w]
            tensors = _chunk_buffers(self.spec, b - a, horizon)
            self._conns[w].send(("chunk_buffers", tensors))
            bufs = self._chunk_bufs[w] = _numpy_views(tensors)
        return bufs

    def chunk_wait(self, env_ids: Sequence[int]) -> ChunkSteps:
        """Wait for the chunk started by :meth:`chunk_async` on ``env_ids``; see :class:`ChunkSteps`.

        Raises:
            EnvError: if no chunk runs on those envs, or a worker failed or died.
        """
        workers = self._workers_of(env_ids)
        if any(w not in self._pending for w in workers):
            raise EnvError(f"{self._env_id}: no chunk in flight on env_ids {list(env_ids)[:8]}...")
        ids = list(env_ids)
        n, first = len(ids), ids[0]
        texts: dict[tuple[int, int], str] = {}
        for w in workers:
            horizon = self._pending.pop(w)
            for h, j, text in self._recv_news(w):
                texts[h, self._slices[w][0] + j - first] = text
        reward64 = np.empty((horizon, n), np.float64)
        flags = np.empty((3, horizon, n), bool)
        for w in workers:
            a, b = self._slices[w]
            bufs = self._chunk_bufs[w]
            reward64[:, a - first : b - first] = bufs["reward"][:horizon]
            flags[:, :, a - first : b - first] = bufs["flags"][:, :horizon]
        terms = self._chunk_named("terms", workers, horizon, first, n)
        signals = self._chunk_named("signals", workers, horizon, first, n)
        return self._chunk_steps(ids, reward64, flags, terms, signals, texts, self._obs_bufs, self._final_bufs)

    def _chunk_named(self, channel: str, workers: list[int], horizon: int, first: int, n: int) -> dict[str, np.ndarray]:
        """The chunk's named scalars of ``channel`` ``float32 [H, n]`` (union over ``workers``), from their chunk buffers."""
        names, _ = self._layout(channel, tuple(workers))
        if names is None:
            return {}
        table = np.zeros((len(names), horizon, n), np.float32)
        for w in workers:
            a, b = self._slices[w]
            cols = slice(a - first, b - first)
            w_names, src = self._names[channel][w] or [], self._chunk_bufs[w][channel]
            if w_names == names[: len(w_names)]:  # the usual case: the worker's slots in the union's order
                table[: len(w_names), :, cols] = src[: len(w_names), :horizon]
            else:
                for slot, k in enumerate(w_names):
                    table[names.index(k), :, cols] = src[slot, :horizon]
        return dict(zip(names, table))

    def step_chunk(self, actions: torch.Tensor, record_obs: bool = False) -> ChunkSteps:
        """One five-byte message per worker (actions in its shared chunk buffer), then :meth:`chunk_wait`.

        With ``record_obs`` (every step rendered and returned) this is the step-by-step default.
        """
        if record_obs:
            return super().step_chunk(actions, record_obs=True)
        self._launch(list(range(len(self._slices))), self._check_chunk(actions).numpy(), 0)
        steps = self.chunk_wait(list(range(self.num_envs)))
        self._last_obs = steps.obs
        return steps

    def expert_actions(self) -> torch.Tensor:
        """Scripted-expert actions ``[B, A]`` computed inside the workers."""
        for c in self._conns:
            c.send(("expert", None))
        acts = [a for w in range(len(self._conns)) for a in self._recv(w)]
        return torch.from_numpy(np.stack(acts).astype(np.float32))

    def schedule_tasks(self, weights: Sequence[float] | np.ndarray | None = None,
                       plans: dict[int, list[Any]] | None = None) -> None:
        """See :meth:`sim.core.VecEnv.schedule_tasks`; one message per worker."""
        self._check_idle("schedule_tasks")
        w, plans = self._check_schedule(weights, plans)
        for c, (a, b) in zip(self._conns, self._slices):
            c.send(("tasks", (w, {i - a: p for i, p in plans.items() if a <= i < b})))
        for k in range(len(self._conns)):
            self._recv(k)

    def lower_worker_priority(self, nice: int) -> int:
        """See :meth:`sim.core.VecEnv.lower_worker_priority`: every thread of every worker (Linux lists them in
        ``/proc/<pid>/task``; elsewhere only each worker's main thread; nothing where the OS has no nice values)."""
        if not hasattr(os, "setpriority"):  # Windows
            return 0
        reniced = 0
        for p in self._procs:
            task_dir = Path(f"/proc/{p.pid}/task")
            tids = [int(t) for t in os.listdir(task_dir)] if task_dir.is_dir() else [p.pid]
            for tid in tids:
                try:
                    os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
                    reniced += 1
                except (ProcessLookupError, PermissionError):  # a thread that just ended; a foreign process
                    pass
        return reniced

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


