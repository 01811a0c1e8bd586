"""A success-filtered buffer of the policy's own decisions: :class:`SuccessBuffer`.

On-policy collection continues episodes across iterations, so whether a decision belongs to a successful
episode is known only when that episode ends, possibly iterations later. The buffer keeps each env's decisions
of its running episode aside (:meth:`SuccessBuffer.add_rollout`), moves them in when the episode ends in
success and drops them when it fails; the kept rows are drawn like any other chunk source
(:class:`vla_rl.data.mix.ChunkSource`), so they mix with demos through :class:`vla_rl.data.mix.MixedSource`.
Rows live in a ring of ``capacity`` decisions: once full, the oldest successes make room for new ones.

Hindsight relabeling (``relabel``): a failed episode that accomplished another task of a multi-task env (the
env's ``achieved_task`` signal, e.g. it lifted the green cube when told to lift the red one) is a successful
episode of that other task. Its decisions up to the one in which that task first succeeded join the buffer under
that task's instruction, as language-conditioned imitation relabels play (Lynch & Sermanet 2021) and hindsight
experience replay relabels goals (Andrychowicz et al. 2017). The same images then appear under two instructions
with two different actions, the contrast that teaches a policy which object an instruction names.

Persistence (:meth:`SuccessBuffer.persist`): the ring can hold hundreds of megabytes of images, too much to
rewrite into every checkpoint. Its rows go instead to an append-only store, a folder of shard files
``rows_<first>_<end>.pt.zlib`` (global row numbers; ``torch.save`` bytes, zlib-compressed, each shard written
atomically). :meth:`SuccessBuffer.state_dict` writes the rows added since the previous one as a new shard and
returns a few numbers naming the rows the ring holds; a checkpoint keeps those numbers, and :meth:`SuccessBuffer.load_state_dict` reads the rows back from the
shards, so a resumed run imitates the successes it had collected. Shards that no kept checkpoint needs are
deleted, and so are shards written after the checkpoint a run resumes from.
"""

from __future__ import annotations

import io
import pickle
import re
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor

from sim.tasks import TASK_INDEX
from vla_core.keys import TASK
from vla_core.manifest import IntegrityError, fsync_dir, write_file_atomic
from vla_rl.data.chunks import ChunkBatch, ChunkDataset

if TYPE_CHECKING:
    from vla_rl.rollout import Rollout


class _Decision(NamedTuple):
    """One decision of a running episode, waiting for the episode's outcome."""

    obs: dict[str, Any]
    action: Tensor
    achieved: int
    """Index of the other task its steps first accomplished (hindsight relabeling), else -1."""
    reward: float
    """The run's reward of the decision (``Rollout.rewards``), summed when ``success_return`` judges the episode."""


_SHARD = re.compile(r"rows_(\d+)_(\d+)\.pt\.zlib")


class SuccessBuffer:
    """The decisions of successful episodes, as chunk rows (observation, executed action chunk).

    Args:
        capacity: rows kept at most (the oldest leave first).
        keys: the observation keys kept, in this order (to mix with a source that has exactly these, e.g.
            demos); None keeps every key of the rollouts.
        relabel: the instruction of each task of the env (``EnvSpec.instructions``, indexed like its
            ``achieved_task`` signal) to relabel failed episodes that accomplished another task (module doc);
            None keeps only episodes that succeeded at their own instruction.
        success_return: None: an episode succeeded when the env reported success (``EpisodeRecord.success``).
            A number: when the run's reward (``Rollout.rewards``, the configured terms) summed over the
            episode's decisions reaches it: with ``{classifier: 1.0}`` a learned success classifier's verdict,
            for training where no simulator reports success (a real robot).

    Raises:
        ValueError: for ``capacity < 1``.
    """

    def __init__(self, capacity: int, keys: list[str] | None = None,
                 relabel: tuple[str, ...] | None = None, success_return: float | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"SuccessBuffer capacity must be >= 1, got {capacity}")
        self.success_return = success_return
        self.capacity = capacity
        self.keys = keys
        self._obs: dict[str, Any] = {}
        self._actions: Tensor | None = None
        self._mask: Tensor | None = None
        self.rows_added = 0
        """Rows ever put in the ring: row n (its global number) sits at position ``n % capacity``."""
        self.relabel = relabel
        self._pending: dict[int, list[_Decision]] = {}
        self.episodes_kept = 0
        self.episodes_dropped = 0
        self.episodes_relabeled = 0
        """Failed episodes kept under another task's instruction (counted in ``episodes_kept`` too)."""
        self.store: Path | None = None
        self._keep = 1
        self._windows: list[tuple[int, int]] = []  # (first, end) rows of the last ``keep`` states, oldest first

    def __len__(self) -> int:
        return min(self.rows_added, self.capacity)

    def add_rollout(self, rollout: Rollout) -> None:
        """File every valid decision of ``rollout`` under its env's running episode; an episode that ended in
        the rollout moves into the buffer if it succeeded (the env's :class:`vla_rl.rollout.EpisodeRecord`
        flag, or its reward with ``success_return``) and is dropped otherwise. Decisions of episodes still
        running wait for a later rollout."""
        missing = [k for k in self.keys or () if k not in rollout.obs]
        if missing:
            raise KeyError(f"the rollout's observations lack {missing} (have {sorted(rollout.obs)})")
        keys = self.keys if self.keys is not None else list(rollout.obs)
        achieved = self._achieved(rollout)
        ended = rollout.terminated | rollout.truncated
        outcomes: dict[int, list[bool]] = {}
        for ep in rollout.episodes:  # per env, in the order they ended
            outcomes.setdefault(ep.env, []).append(ep.success)
        t_len, b_len = rollout.valid.shape
        for t in range(t_len):
            for b in range(b_len):
                if not bool(rollout.valid[t, b]):
                    continue
                obs = {k: (rollout.obs[k][t][b] if k == TASK else rollout.obs[k][t, b].clone()) for k in keys}
                self._pending.setdefault(b, []).append(
                    _Decision(obs, rollout.actions[t, b], int(achieved[t, b]), float(rollout.rewards[t, b])))
                if bool(ended[t, b]):
                    queue = outcomes.get(b, [])
                    env_success = queue.pop(0) if queue else False  # popped either way: the queue stays in step
                    rows = self._pending.pop(b)
                    success = (env_success if self.success_return is None
                               else sum(row.reward for row in rows) >= self.success_return)
                    if success:
                        self.episodes_kept += 1
                        for row in rows:
                            self._put(row.obs, row.action)
                    elif not self._keep_relabeled(rows):
                        self.episodes_dropped += 1

    def _achieved(self, rollout: Rollout) -> Tensor:
        """``[T, B]``: per decision, the index of the other task its executed steps first accomplished, else -1."""
        t_len, b_len = rollout.valid.shape
        if self.relabel is None:
            return torch.full((t_len, b_len), -1)
        signal = rollout.step_signals.get("achieved_task")
        if signal is None:
            raise KeyError("hindsight relabeling needs the env's achieved_task signal (a multi-task tabletop env, "
                           f"e.g. mujoco/pick-any); the rollout's signals are {sorted(rollout.step_signals)}")
        code = signal.round().long()  # [T, B, H]: 1 + index, 0 for none (and on held steps)
        first_step = (code > 0).int().argmax(-1, keepdim=True)  # the first accomplishing step (0 when none)
        return code.gather(-1, first_step).squeeze(-1) - 1

    def _keep_relabeled(self, rows: list[_Decision]) -> bool:
        """File a failed episode's decisions up to its first accomplishment of another task under that task's
        instruction; False when it accomplished none (or relabeling is off)."""
        if self.relabel is None:
            return False
        n, task = next(((n, row.achieved) for n, row in enumerate(rows) if row.achieved >= 0), (-1, -1))
        if task < 0:
            return False
        if task >= len(self.relabel):
            raise ValueError(f"achieved_task {task} is not an index into the env's {len(self.relabel)} task "
                             "instructions")
        for row in rows[: n + 1]:
            row.obs[TASK] = self.relabel[task]
            if TASK_INDEX in row.obs:
                row.obs[TASK_INDEX] = torch.as_tensor(task, dtype=row.obs[TASK_INDEX].dtype)
            self._put(row.obs, row.action)
        self.episodes_kept += 1
        self.episodes_relabeled += 1
        return True

    def forget_running(self) -> None:
        """Drop the decisions of running episodes (their envs were reset: those episodes never end)."""
        self._pending.clear()

    def _allocate(self, obs: dict[str, Any], action: Tensor) -> None:
        """The ring's storage, shaped like one row."""
        self._actions = torch.zeros((self.capacity, *action.shape), dtype=torch.float32)
        self._mask = torch.ones(self._actions.shape[:2], dtype=torch.bool)  # every chunk step is the policy's
        for k, v in obs.items():
            self._obs[k] = [""] * self.capacity if k == TASK else torch.zeros((self.capacity, *v.shape), dtype=v.dtype)

    def _put(self, obs: dict[str, Any], action: Tensor) -> None:
        if self._actions is None:
            self._allocate(obs, action)
        i = self.rows_added % self.capacity
        self._actions[i] = action.float()
        for k, v in obs.items():
            self._obs[k][i] = v
        self.rows_added += 1

    def persist(self, folder: str | Path, keep: int = 1) -> None:
        """Mirror the kept rows to an append-only store in ``folder`` (module doc), so that :meth:`state_dict` can
        name them instead of holding them; ``keep``: how many of the latest states must stay loadable (a run's
        ``keep_last`` checkpoints)."""
        if keep < 1:
            raise ValueError(f"SuccessBuffer.persist keep must be >= 1, got {keep}")
        self.store, self._keep = Path(folder), keep

    def _shards(self) -> list[tuple[int, int, Path]]:
        """``(first, end, path)`` of the store's shards, in row order; leftover temporary files are removed."""
        assert self.store is not None
        if not self.store.exists():
            return []
        found = []
        for path in self.store.iterdir():
            match = _SHARD.fullmatch(path.name)
            if match:
                found.append((int(match[1]), int(match[2]), path))
            elif path.name.startswith(".rows_"):  # a write killed before its rename
                path.unlink(missing_ok=True)
        return sorted(found)

    def _remove_shards(self, doomed: Callable[[int, int], bool]) -> None:
        removed = False
        for first, end, path in self._shards():
            if doomed(first, end):
                path.unlink(missing_ok=True)
                removed = True
        if removed:
            assert self.store is not None
            fsync_dir(self.store)

    def state_dict(self) -> dict[str, Any]:
        """The numbers that name the ring's rows in the store, after writing the rows added since the last call
        as a shard; shards no longer needed by the last ``keep`` states are deleted.

        Raises:
            ValueError: when :meth:`persist` named no store.
            OSError: from the file system (the previous states stay loadable).
        """
        if self.store is None:
            raise ValueError("SuccessBuffer.state_dict needs a store: call persist(folder) first")
        self.store.mkdir(parents=True, exist_ok=True)
        if not self._windows:  # never saved nor loaded: shards left by an earlier start that never checkpointed
            self._remove_shards(lambda first, end: True)
        saved = self._windows[-1][1] if self._windows else 0  # rows before it are in the store already
        first = max(saved, self.rows_added - len(self))
        if first < self.rows_added:
            rows = torch.arange(first, self.rows_added)
            at = rows % self.capacity
            assert self._actions is not None
            shard = {"actions": self._actions[at].clone(),
                     "obs": {k: ([v[i] for i in at.tolist()] if k == TASK else v[at].clone())
                             for k, v in self._obs.items()}}
            data = io.BytesIO()
            torch.save(shard, data)
            packed = zlib.compress(data.getbuffer(), 1)  # rendered tabletop frames shrink about 20x, in ms
            write_file_atomic(self.store / f"rows_{first:012d}_{self.rows_added:012d}.pt.zlib",
                              lambda f: f.write(packed))
        window = (self.rows_added - len(self), self.rows_added)
        if not self._windows or self._windows[-1] != window:  # asked twice for one checkpoint: counted once
            self._windows = [*self._windows, window][-self._keep:]
        oldest = min(start for start, _ in self._windows)
        self._remove_shards(lambda first, end: end <= oldest)
        return {"rows_added": self.rows_added, "capacity": self.capacity, "windows": list(self._windows),
                "episodes": [self.episodes_kept, self.episodes_dropped, self.episodes_relabeled]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Refill the ring with the rows :meth:`state_dict` named, read from the store; shards written after that
        state (by the run that is being resumed past) are deleted.

        Raises:
            ValueError: when no store was named, or the state is of a buffer of another capacity.
            FileNotFoundError: when the store lacks rows the state names (naming the folder and the rows).
            vla_core.manifest.IntegrityError: for a damaged shard (naming it).
        """
        if self.store is None:
            raise ValueError("SuccessBuffer.load_state_dict needs a store: call persist(folder) first")
        if state["capacity"] != self.capacity:
            raise ValueError(f"the success buffer was saved with capacity {state['capacity']}; this run's is "
                             f"{self.capacity} (algo.buffer_size): resume with the same setting")
        total = state["rows_added"]
        self._remove_shards(lambda first, end: end > total)
        cursor = max(0, total - self.capacity)  # the next row to read: the ring holds rows [cursor, total)
        for first, end, path in self._shards():
            if not first <= cursor < end:
                continue
            try:
                shard = torch.load(io.BytesIO(zlib.decompress(path.read_bytes())), weights_only=True)
            except (zlib.error, RuntimeError, EOFError, pickle.UnpicklingError) as e:
                raise IntegrityError(f"{path} is damaged ({e}); the success buffer cannot be restored from it")
            rows = torch.arange(cursor, min(end, total))
            at, part = rows % self.capacity, rows - first
            if self._actions is None:
                self._allocate({k: v[0] for k, v in shard["obs"].items()}, shard["actions"][0])
            assert self._actions is not None
            self._actions[at] = shard["actions"][part]
            for k, v in shard["obs"].items():
                if k == TASK:
                    for i, j in zip(at.tolist(), part.tolist(), strict=True):
                        self._obs[k][i] = v[j]
                else:
                    self._obs[k][at] = v[part]
            cursor = int(rows[-1]) + 1
        if cursor < total:
            raise FileNotFoundError(f"the success buffer's rows {cursor}..{total - 1} are not in its store "
                                    f"{self.store} (shards rows_<first>_<end>.pt.zlib); restore that folder, or start "
                                    "the run anew")
        self.rows_added = total
        self._windows = [tuple(w) for w in state["windows"]]
        self.episodes_kept, self.episodes_dropped, self.episodes_relabeled = state["episodes"]

    def sample(self, batch_size: int, generator: torch.Generator) -> ChunkBatch:
        """``batch_size`` kept rows drawn uniformly with replacement (one ``torch.randint`` on ``generator``).

        Raises:
            ValueError: when the buffer is empty.
        """
        if not len(self):
            raise ValueError("SuccessBuffer is empty: no episode has succeeded yet")
        assert self._actions is not None and self._mask is not None
        n = len(self)
        kept = ChunkDataset(obs={k: v[:n] for k, v in self._obs.items()}, actions=self._actions[:n],
                            mask=self._mask[:n], episodes=self.episodes_kept)
        return kept.sample(batch_size, generator)
