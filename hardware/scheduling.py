"""Action-chunk scheduling: which action runs at which control step, and the policy worker.

A chunk computed from the observation of step ``s`` holds the actions for
steps ``s, s+1, ..., s+H-1``. The scheduler keeps the chunks that still cover
future steps and answers "what is the action for step k":

- ``execute``: the newest chunk that covers ``k`` wins (with ``replan_every =
  H`` this is plain chunk execution; smaller values re-plan earlier and
  switch to the fresher chunk);
- ``blend``: a weighted average of every chunk covering ``k`` (temporal
  ensembling); an action ``i`` steps into its chunk weighs
  ``exp(-blend_decay * i)``, so with ``blend_decay > 0`` fresher predictions
  count more and ``0`` averages uniformly.

Actions of a chunk for steps that have already passed (because inference took
several control periods) are skipped, never executed late.
"""

from __future__ import annotations

import enum
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


class ChunkMode(str, enum.Enum):
    """How overlapping chunks combine."""

    EXECUTE = "execute"
    BLEND = "blend"


@dataclass
class ChunkConfig:
    """Action-chunk scheduling."""

    mode: ChunkMode = ChunkMode.EXECUTE
    """``execute`` (newest chunk wins) or ``blend`` (weighted average of overlapping chunks)."""
    replan_every: int = 0
    """Control steps between policy calls; 0 = the policy's chunk size (run each chunk to its end)."""
    blend_decay: float = 0.0
    """``blend``: weight ``exp(-blend_decay * i)`` for an action ``i`` steps into its chunk."""
    async_inference: bool = True
    """Run the policy in a worker thread so the control loop keeps its rate while it thinks."""
    command_horizon: int = 1
    """Points sent with each command (ROS trajectory controllers interpolate through them)."""

    def __post_init__(self) -> None:
        if not isinstance(self.mode, ChunkMode):
            try:
                self.mode = ChunkMode(self.mode)
            except ValueError:
                raise ValueError(f"chunk.mode: {self.mode!r} is not 'execute' or 'blend'") from None
        if self.replan_every < 0:
            raise ValueError(f"chunk.replan_every must be >= 0, got {self.replan_every}")
        if self.blend_decay < 0:
            raise ValueError(f"chunk.blend_decay must be >= 0, got {self.blend_decay}")
        if self.command_horizon < 1:
            raise ValueError(f"chunk.command_horizon must be >= 1, got {self.command_horizon}")


@dataclass
class _Chunk:
    start: int
    actions: np.ndarray  # [H, A]

    @property
    def end(self) -> int:  # first step not covered
        return self.start + self.actions.shape[0]


class ChunkScheduler:
    """Answers which action runs at each step, from the chunks received so far."""

    def __init__(self, mode: ChunkMode = ChunkMode.EXECUTE, blend_decay: float = 0.0) -> None:
        self.mode = ChunkMode(mode)
        self.blend_decay = float(blend_decay)
        self._chunks: list[_Chunk] = []

    def reset(self) -> None:
        """Drop every chunk (new episode, after an e-stop)."""
        self._chunks.clear()

    def add(self, actions: np.ndarray, start_step: int) -> None:
        """Add a chunk ``[H, A]`` whose action 0 belongs to ``start_step``.

        Raises:
            ValueError: for a chunk that is not 2-D or whose A differs from earlier chunks.
        """
        actions = np.asarray(actions, dtype=np.float64)
        if actions.ndim != 2 or actions.shape[0] < 1:
            raise ValueError(f"action chunk must be [H, A] with H >= 1, got {list(actions.shape)}")
        if self._chunks and self._chunks[-1].actions.shape[1] != actions.shape[1]:
            raise ValueError(f"action dim changed from {self._chunks[-1].actions.shape[1]} to {actions.shape[1]}")
        self._chunks.append(_Chunk(start_step, actions))
        self._chunks.sort(key=lambda c: c.start)

    def covered_until(self) -> int:
        """First step no chunk covers (``-1`` with no chunks)."""
        return max((c.end for c in self._chunks), default=-1)

    def action(self, step: int) -> np.ndarray | None:
        """The action ``[A]`` for ``step``, or None if no chunk covers it. Forgets chunks that ended."""
        self._chunks = [c for c in self._chunks if c.end > step]
        covering = [c for c in self._chunks if c.start <= step]
        if not covering:
            return None
        if self.mode is ChunkMode.EXECUTE:
            newest = covering[-1]
            return newest.actions[step - newest.start].copy()
        offsets = np.array([step - c.start for c in covering], dtype=np.float64)
        weights = np.exp(-self.blend_decay * offsets)
        stacked = np.stack([c.actions[step - c.start] for c in covering])
        return (weights[:, None] * stacked).sum(0) / weights.sum()

    def lookahead(self, step: int, horizon: int) -> np.ndarray | None:
        """Actions for ``step .. step+horizon-1`` as ``[n, A]`` (``n <= horizon``, stops at the first gap)."""
        first = self.action(step)
        if first is None:
            return None
        out = [first]
        for k in range(step + 1, step + horizon):
            covering = [c for c in self._chunks if c.start <= k < c.end]
            if not covering:
                break
            if self.mode is ChunkMode.EXECUTE:
                out.append(covering[-1].actions[k - covering[-1].start])
            else:
                offsets = np.array([k - c.start for c in covering], dtype=np.float64)
                w = np.exp(-self.blend_decay * offsets)
                out.append((w[:, None] * np.stack([c.actions[k - c.start] for c in covering])).sum(0) / w.sum())
        return np.stack(out)


@dataclass
class Inference:
    """A finished policy call: the chunk, the step its observation was taken at, and timing."""

    actions: np.ndarray | None  # [H, A], None on error
    start_step: int
    latency_s: float
    error: BaseException | None = None
    tag: int = 0


class PolicyWorker:
    """Runs ``infer(obs) -> [H, A]`` one call at a time, in a thread or inline.

    With ``threaded=True`` :meth:`submit` returns at once and the result
    appears in :meth:`poll`; :meth:`busy_s` reports how long the running call
    has taken (the watchdog's policy deadline). A call that never returns
    keeps the worker busy; the daemon thread is abandoned on :meth:`close`.
    """

    def __init__(self, infer: Callable[[dict], np.ndarray], threaded: bool = True) -> None:
        self._infer = infer
        self._threaded = threaded
        self._requests: queue.Queue = queue.Queue(maxsize=1)
        self._results: queue.Queue = queue.Queue()
        self._busy_since: float | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(target=self._loop, name="policy-worker", daemon=True)
            self._thread.start()

    def busy_s(self, now: float) -> float:
        """Seconds the current call has run (0 when idle)."""
        with self._lock:
            return 0.0 if self._busy_since is None else now - self._busy_since

    @property
    def idle(self) -> bool:
        """True when no call is running or queued."""
        with self._lock:
            return self._busy_since is None

    def submit(self, obs: dict, start_step: int, tag: int = 0) -> None:
        """Start a call on ``obs`` (taken at ``start_step``); ``tag`` comes back with the result.

        Raises:
            RuntimeError: if a call is already running.
        """
        with self._lock:
            if self._busy_since is not None:
                raise RuntimeError("PolicyWorker.submit while a call is running")
            self._busy_since = time.monotonic()
        if self._threaded:
            self._requests.put((obs, start_step, tag))
        else:
            self._results.put(self._run(obs, start_step, tag))

    def poll(self) -> list[Inference]:
        """Finished calls since the last poll (oldest first)."""
        out = []
        while True:
            try:
                out.append(self._results.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        """Stop the thread after its current call (does not wait for a hung call)."""
        if self._thread is not None:
            try:
                self._requests.put_nowait(None)
            except queue.Full:
                pass
            self._thread.join(timeout=0.5)

    def _run(self, obs: dict, start_step: int, tag: int) -> Inference:
        t0 = time.monotonic()
        try:
            actions, err = np.asarray(self._infer(obs), dtype=np.float64), None
        except Exception as e:  # noqa: BLE001  (reported to the runner, which stops the run)
            actions, err = None, e
        with self._lock:
            self._busy_since = None
        return Inference(actions, start_step, time.monotonic() - t0, err, tag)

    def _loop(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            self._results.put(self._run(*item))
