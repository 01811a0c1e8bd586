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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor

from sim.tasks import TASK_INDEX
from vla_core.keys import TASK
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
        self._size = 0
        self._next = 0
        self.relabel = relabel
        self._pending: dict[int, list[_Decision]] = {}
        self.episodes_kept = 0
        self.episodes_dropped = 0
        self.episodes_relabeled = 0
        """Failed episodes kept under another task's instruction (counted in ``episodes_kept`` too)."""

    def __len__(self) -> int:
        return self._size

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

    def _put(self, obs: dict[str, Any], action: Tensor) -> None:
        if self._actions is None:
            self._actions = torch.zeros((self.capacity, *action.shape), dtype=torch.float32)
            self._mask = torch.ones(self._actions.shape[:2], dtype=torch.bool)  # every chunk step is the policy's
            for k, v in obs.items():
                self._obs[k] = [""] * self.capacity if k == TASK else torch.zeros((self.capacity, *v.shape), dtype=v.dtype)
        i = self._next
        self._actions[i] = action.float()
        for k, v in obs.items():
            self._obs[k][i] = v
        self._next = (i + 1) % self.capacity
        self._size = min(self._size + 1, self.capacity)

    def sample(self, batch_size: int, generator: torch.Generator) -> ChunkBatch:
        """``batch_size`` kept rows drawn uniformly with replacement (one ``torch.randint`` on ``generator``).

        Raises:
            ValueError: when the buffer is empty.
        """
        if not self._size:
            raise ValueError("SuccessBuffer is empty: no episode has succeeded yet")
        assert self._actions is not None and self._mask is not None
        n = self._size
        kept = ChunkDataset(obs={k: v[:n] for k, v in self._obs.items()}, actions=self._actions[:n],
                            mask=self._mask[:n], episodes=self.episodes_kept)
        return kept.sample(batch_size, generator)
