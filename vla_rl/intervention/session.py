"""Intervention episodes: the policy acts, an operator takes over, every step is labelled and recorded.

:func:`run_session` steps a vector env one control step at a time. Each env
has a :class:`Controller` that, per step, either leaves control to the policy
(the next action of the policy's current chunk) or returns the operator's
action, with the step's label (``policy`` / ``recovery`` / ``correction``).
After a takeover the policy re-plans from the observation it is handed back.
Frames go to a LeRobotDataset (:class:`sim.dataset.EpisodeRecorder`) with
LeRobot's ``intervention`` flag and our ``intervention_label``
(:mod:`vla_rl.intervention.labels`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from tqdm import tqdm

from sim.core import VecEnv
from sim.dataset import EpisodeRecorder
from vla_core.keys import INTERVENTION, INTERVENTION_LABEL, OBS_ENV_STATE, OBS_STATE, TASK
from vla_core.labels import Label
from vla_rl.intervention.operator import OperatorConfig, SimulatedOperator, count_recoveries
from vla_rl.intervention.teleop import ActionSource, CameraView, ScriptedKeys, SessionKeys

ActFn = Callable[[dict[str, Any]], torch.Tensor]  # batched obs -> action chunk [B, H, A]


class Controller(Protocol):
    """Decides, per env and step, who acts (see module doc)."""

    def reset(self) -> None: ...

    def act(self, obs: dict[str, Any], index: int, step: int) -> tuple[np.ndarray | None, Label]: ...


class OperatorController:
    """The :class:`~vla_rl.intervention.operator.SimulatedOperator` as a controller (reads ``observation.state``
    and the privileged ``observation.env_state``)."""

    def __init__(self, operator: SimulatedOperator) -> None:
        self.operator = operator

    def reset(self) -> None:
        self.operator.reset()

    def act(self, obs: dict[str, Any], index: int, step: int) -> tuple[np.ndarray | None, Label]:
        return self.operator.act(_np(obs[OBS_STATE][index]), _np(obs[OBS_ENV_STATE][index]))


class TeleopController:
    """A person at a teleop device: :class:`~vla_rl.intervention.teleop.SessionKeys` say who is in control and
    which segment it is; an :class:`~vla_rl.intervention.teleop.ActionSource` gives the motion (None: hold still,
    gripper as last commanded). ``script`` presses keys at given steps (tests, demos)."""

    def __init__(self, keys: SessionKeys, source: ActionSource, action_dim: int,
                 script: ScriptedKeys | None = None) -> None:
        self.keys, self.source, self.script = keys, source, script
        self.hold = np.zeros(action_dim, dtype=np.float32)

    def reset(self) -> None:
        pass

    def act(self, obs: dict[str, Any], index: int, step: int) -> tuple[np.ndarray | None, Label]:
        if self.script is not None:
            self.script.feed(step, self.keys)
        label = self.keys.label()
        if label == Label.POLICY:
            return None, label
        action = self.source.action()
        if action is None:
            action = self.hold.copy()
        self.hold[-1] = action[-1]
        return np.asarray(action, dtype=np.float32), label


@dataclass
class SessionStats:
    """What a session did (``vla-rl intervene`` prints it; benchmarks count operator steps with it)."""

    episodes: int = 0
    successes: int = 0
    steps: dict[str, int] = field(default_factory=lambda: {label.text: 0 for label in Label})
    takeovers: int = 0
    """Recorded episodes in which the operator took over, those cut short by the budget or a quit included."""
    cut: int = 0
    """Episodes recorded unfinished: under way when the operator budget ran out or the session was quit (not
    counted in ``episodes``)."""
    wall_s: float = 0.0
    outcomes: list[bool] = field(default_factory=list)
    """Per episode: success."""
    recoveries: list[int] = field(default_factory=list)
    """Per episode: recovery manoeuvres the policy made itself (:func:`~vla_rl.intervention.operator.count_recoveries`
    on its stage progress, counted only on episodes without a takeover; -1 for the others)."""
    furthest: list[int] = field(default_factory=list)
    """Per episode: the most leading task stages that held at once (the maximum of its stage progress, read at the
    start of every step, so the state the last step left is not counted); -1 without ``progress_of``."""

    @property
    def operator_steps(self) -> int:
        """Steps the operator controlled (recovery + correction)."""
        return self.steps["recovery"] + self.steps["correction"]

    def as_dict(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "successes": self.successes, "steps": dict(self.steps),
                "operator_steps": self.operator_steps, "takeovers": self.takeovers, "cut": self.cut,
                "wall_s": round(self.wall_s, 2)}


def run_session(env: VecEnv, act: ActFn, controllers: list[Controller], episodes: int, seed: int,
                recorder: EpisodeRecorder | None = None, exec_steps: int = 0, view: CameraView | None = None,
                keys: SessionKeys | None = None, progress_of: Callable[[dict[str, Any], int], int] | None = None,
                progress: bool = True, operator_budget: int = 0) -> SessionStats:
    """Run ``episodes`` intervention episodes (module doc) and record them.

    Args:
        env: the vector env (reset with ``seed``); one controller per env.
        act: the policy, batched obs -> action chunk ``[B, H, A]``.
        recorder: where frames go (None: nothing is recorded).
        exec_steps: actions of each policy chunk executed before re-planning (0 = the whole chunk).
        view: camera shown to the operator (env 0's first camera).
        keys: session keys whose end-of-episode / quit flags apply (teleop sessions).
        progress_of: ``(obs, env index) -> stage progress``, to count the policy's own recovery manoeuvres.
        operator_budget: stop once the operator has controlled this many steps (0 = no limit); the episodes
            under way are recorded up to that point.

    Each env counts a fixed share of the ``episodes`` (``episodes // num_envs``, one more for the first
    ``episodes % num_envs``) and then idles, the policy acting unwatched and unrecorded, until the others are
    done: counting whichever episodes end first would favour short ones (successes end early, failures run to the
    time limit) and inflate the success rate.

    Returns:
        :class:`SessionStats`.
    """
    b = env.num_envs
    if len(controllers) != b:
        raise ValueError(f"run_session: {len(controllers)} controllers for {b} envs")
    stats = SessionStats()
    start = time.perf_counter()
    obs = env.reset(seed=seed)
    queues: list[deque[np.ndarray]] = [deque() for _ in range(b)]
    frames: list[list[tuple[dict[str, Any], np.ndarray, float, bool, Label]]] = [[] for _ in range(b)]
    prog: list[list[int]] = [[] for _ in range(b)]
    took: list[bool] = [False] * b
    quota = [episodes // b + int(i < episodes % b) for i in range(b)]
    counts = [0] * b
    for c in controllers:
        c.reset()
    step = 0
    with tqdm(total=episodes, desc=f"intervene {env.spec.env_id}", unit="ep", disable=not progress) as bar:
        while stats.episodes < episodes:
            if any(not q for q in queues):
                with torch.no_grad():
                    chunk = act(obs).detach().cpu().numpy()
                h = chunk.shape[1] if exec_steps <= 0 else min(exec_steps, chunk.shape[1])
                for i, q in enumerate(queues):
                    if not q:
                        q.extend(chunk[i, :h])
            actions = np.zeros((b, env.spec.action_dim), dtype=np.float32)
            labels: list[Label] = []
            for i, c in enumerate(controllers):
                if counts[i] >= quota[i]:  # its share is done: idle under the policy, uncounted
                    actions[i] = queues[i].popleft()
                    labels.append(Label.POLICY)
                    continue
                if progress_of is not None:
                    prog[i].append(progress_of(obs, i))
                op_action, label = c.act(obs, i, step)
                if op_action is not None:
                    actions[i] = op_action
                    queues[i].clear()
                    took[i] = took[i] or label != Label.POLICY
                else:
                    actions[i] = queues[i].popleft()
                labels.append(label)
                stats.steps[label.text] += 1
            if view is not None and env.spec.image_keys:
                img = _np(obs[env.spec.image_keys[0]][0])
                view.show(img, f"{labels[0].text}  {obs[TASK][0]}", keys)
            prev = obs
            obs, reward, term, trunc, info = env.step(torch.from_numpy(actions))
            step += 1
            ended, verdict = keys.take_episode_end() if keys is not None else (False, None)
            for i in range(b):
                done = bool(term[i] or trunc[i]) or (ended and i == 0)
                if counts[i] >= quota[i]:
                    if done:
                        queues[i].clear()
                    continue
                frames[i].append(({k: (v[i] if k != TASK else v[i]) for k, v in prev.items()}, actions[i],
                                  float(reward[i]), bool(info["success"][i]), labels[i]))
                if not done:
                    continue
                ok = bool(info["episode"]["success"][i]) if (term[i] or trunc[i]) else bool(verdict)
                counts[i] += 1
                _save(recorder, frames[i])
                stats.episodes += 1
                stats.successes += ok
                stats.outcomes.append(ok)
                stats.takeovers += int(took[i])
                stats.recoveries.append(count_recoveries(prog[i]) if not took[i] and prog[i] else -1)
                stats.furthest.append(max(prog[i]) if prog[i] else -1)
                frames[i], prog[i], took[i] = [], [], False
                queues[i].clear()
                controllers[i].reset()
                if not (term[i] or trunc[i]):
                    obs = _reset_one(env, obs, i)
                bar.update(1)
                bar.set_postfix(success=f"{stats.successes}/{stats.episodes}", operator=stats.operator_steps)
            if (keys is not None and keys.quit) or (operator_budget and stats.operator_steps >= operator_budget):
                for i in range(b):
                    if frames[i]:
                        _save(recorder, frames[i])
                        stats.cut += 1
                        stats.takeovers += int(took[i])
                break
    stats.wall_s = time.perf_counter() - start
    return stats


def _save(recorder: EpisodeRecorder | None, frames: list[tuple[dict[str, Any], np.ndarray, float, bool, Label]]) -> None:
    if recorder is None or not frames:
        return
    for row, action, reward, success, label in frames:
        batched = {k: ([v] if k == TASK else v[None]) for k, v in row.items()}
        extra = {INTERVENTION: np.array([label != Label.POLICY]), INTERVENTION_LABEL: np.array([int(label)], np.int64)}
        recorder.add_frame(batched, action, reward, success, **extra)
    recorder.save_episode()


def _reset_one(env: VecEnv, obs: dict[str, Any], i: int) -> dict[str, Any]:
    """Start a new episode in env ``i`` (the operator ended it with a key): the batch with its row replaced."""
    return env.reset(env_ids=[i])


class PassiveController:
    """Never takes over: the policy alone (with ``progress_of``, :func:`run_session` counts its own recoveries)."""

    def reset(self) -> None:
        pass

    def act(self, obs: dict[str, Any], index: int, step: int) -> tuple[np.ndarray | None, Label]:
        return None, Label.POLICY


def tabletop_progress(obs: dict[str, Any], index: int) -> int:
    """Stage progress of tabletop env ``index`` from its observation (``progress_of`` of :func:`run_session`)."""
    from sim.mujoco_tasks.privileged import observed_state
    from sim.mujoco_tasks.tasks import stage_progress

    task, s, _ = observed_state(_np(obs[OBS_STATE][index]), _np(obs[OBS_ENV_STATE][index]))
    return stage_progress(task, s)


def make_operators(cfg: OperatorConfig, num_envs: int, max_step: float, seed: int) -> list[Controller]:
    """One :class:`OperatorController` per env, noise seeded ``seed + i``."""
    return [OperatorController(SimulatedOperator(cfg, max_step, seed + i)) for i in range(num_envs)]


def _np(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
