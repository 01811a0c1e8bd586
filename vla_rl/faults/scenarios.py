"""The runs faults are injected into: a checkpoint write, a dataset recording and a tiny ``vla-rl train`` run,
each small enough to be repeated at every file operation it does."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from policies.compact.config import CompactFlowConfig
from policies.compact.policy import CompactFlowPolicy
from sim.core import OBS_STATE, EnvSpec, TensorSpec
from sim.dataset import EpisodeRecorder
from vla_rl import checkpoint as ckpt
from vla_rl.cli import run
from vla_rl.faults.inject import Outcome, count_events, run_forked


def tiny_policy() -> CompactFlowPolicy:
    """A seeded compact-flow policy of a few thousand weights (state only, 2-d actions)."""
    torch.manual_seed(0)
    return CompactFlowPolicy(CompactFlowConfig(
        cameras=(), state_dim=3, action_dim=2, chunk_size=4, width=32, heads=2, expert_layers=1,
        text_encoder="hashed", text_buckets=64, value_hidden=16, noise_hidden=8))


def save(ckpt_dir: Path, iteration: int, policy: CompactFlowPolicy | None = None, keep_last: int = 3) -> Path:
    """Save checkpoint ``iteration`` of ``policy`` (default :func:`tiny_policy`) under ``ckpt_dir``; its learner
    state ``w`` is ``iteration`` four times, so a resume can tell which checkpoint it read."""
    policy = policy or tiny_policy()
    state = {"learner": {"w": torch.full((4,), float(iteration))}, "rng": ckpt.rng_state(),
             "iteration": iteration, "env_steps": 10 * iteration}
    return ckpt.save_checkpoint(ckpt_dir, iteration, policy, state, {"iterations": 9}, keep_last,
                                report=lambda line: None)


def prepared(folder: Path) -> tuple[Path, Any, int]:
    """``folder/base`` holding checkpoint 1, the policy to save as checkpoint 2, and how many file operations
    (kill points) writing checkpoint 2 there takes."""
    base = folder / "base"
    save(base, 1)
    policy = tiny_policy()
    probe = folder / "probe"
    shutil.copytree(base, probe)
    return base, policy, count_events(lambda: str(save(probe, 2, policy)), probe).events


EPISODES, LENGTH = 3, 4
SPEC = EnvSpec(env_id="test/faults", observation={OBS_STATE: TensorSpec((3,), torch.float32),
                                                  "observation.images.front": TensorSpec((8, 8, 3), torch.uint8)},
               action=TensorSpec((2,), torch.float32), max_episode_steps=LENGTH, control_freq=10.0,
               cameras=("front",))


def record(root: Path, episodes: int = EPISODES) -> str:
    """Record ``episodes`` deterministic episodes into a new dataset at ``root`` (as ``vla-rl collect`` does)."""
    rng = np.random.default_rng(0)
    rec = EpisodeRecorder(root, "local/faults", SPEC, fps=10)
    for _ in range(episodes):
        for t in range(LENGTH):
            obs = {OBS_STATE: torch.as_tensor(rng.normal(size=(1, 3)), dtype=torch.float32),
                   "observation.images.front": torch.as_tensor(rng.integers(0, 256, (1, 8, 8, 3)), dtype=torch.uint8),
                   "task": ["pick"]}
            rec.add_frame(obs, rng.normal(size=2).astype(np.float32), float(t), t == LENGTH - 1)
        rec.save_episode()
    return str(rec.finalize())


TINY_RUN = [
    "--env.id", "mujoco/pick-red", "--env.num_envs", "2", "--env.image_size", "32", "--env.max_episode_steps", "16",
    "--policy.type", "compact-flow", "--policy.width", "32", "--policy.heads", "2", "--policy.chunk_size", "4",
    "--policy.text_encoder", "hashed", "--policy.cnn_channels", "[8,16]", "--policy.image_tokens", "2",
    "--policy.sampler.num_steps", "2", "--policy.value_hidden", "32",
    "--algo.decisions_per_iter", "4", "--algo.epochs", "1", "--algo.minibatch_size", "4", "--algo.critic_warmup_iters", "1",
    "--eval.episodes", "2", "--eval.every", "0", "--eval.video", "false",
    "--logging.wandb", "false", "--logging.tensorboard", "false",
]
"""A ``vla-rl train`` run of a few seconds an iteration (the training tests' run too)."""
TINY = [*TINY_RUN, "--env.num_workers", "0"]
"""The fault scenarios' run: :data:`TINY_RUN` with the envs in the run's own process, so a SIGKILL leaves no orphan."""
ITERATIONS = 5


def train_forked(run_dir: Path, iterations: int = ITERATIONS, resume: bool = False, **faults: Any) -> Outcome:
    """``vla-rl train`` (:data:`TINY`) in a forked child; ``faults`` go to :func:`run_forked` (its file-system
    events count under ``run_dir``)."""
    args = ["train", *TINY, "--iterations", str(iterations), "--run_dir", str(run_dir)]
    if resume:
        args += ["--resume", "true"]
    run_dir.mkdir(parents=True, exist_ok=True)

    def work() -> None:
        run(args)

    faults.setdefault("capture", True)
    return run_forked(work, run_dir, **faults)


def metric_rows(run_dir: Path) -> dict[int, dict]:
    """``metrics.jsonl`` as ``{step: row}`` (a step logged twice, before a kill and after the resume, keeps the
    later row), without timings."""
    rows: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        rows[r["step"]] = {k: v for k, v in r.items() if not k.startswith("time/")}
    return rows


def logged_iterations(run_dir: Path) -> int:
    """Training iterations whose metrics reached ``metrics.jsonl``: its distinct steps (env steps, one per
    iteration; a resumed run logs an iteration again under the same step) less the evaluation before training
    (step 0). A line torn by the kill does not count."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    steps = {json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")}
    return max(len(steps - {0}), 0)


_RESUMED = re.compile(r"resuming .* at iteration (\d+) from")


@dataclass
class KillReport:
    """What the kills of one run cost."""

    kills: int = 0
    resumes: int = 0
    lost: list[int] = field(default_factory=list)
    """Per kill: iterations logged before it minus the iteration resumed from."""


def kill_and_resume(run_dir: Path, points: list[tuple[str, float]]) -> KillReport:
    """Start the run, SIGKILL it at each of ``points`` in turn (``("event", k)``: at the k-th file operation,
    ``("time", s)``: after s seconds), resuming after each, then let it finish. Raises ``AssertionError`` when a
    kill did not land, a damaged checkpoint sits under a final name, or the last run did not finish or resume."""
    report = KillReport()
    resume = False
    for kind, at in points:
        faults = {"kill_at": int(at)} if kind == "event" else {"kill_after_s": at}
        out = train_forked(run_dir, resume=resume, **faults)
        if out.status == "ok":  # the run finished before the kill point
            return report
        assert out.status == "killed", out
        report.kills += 1
        done = logged_iterations(run_dir)
        lines: list[str] = []
        resumed = ckpt.resume_checkpoint(run_dir / "checkpoints", report=lines.append)
        assert lines == [], lines  # nothing under a final name is damaged
        at_iter = ckpt.load_trainer_state(resumed)["iteration"] if resumed is not None else 0
        report.lost.append(done - at_iter)
        resume = True
    out = train_forked(run_dir, resume=resume)
    assert out.status == "ok", out
    if resume:
        report.resumes = report.kills
        match = _RESUMED.search(out.stdout)
        assert match or "starting from scratch" in out.stdout, out.stdout
    return report


def _close(a: Any, b: Any) -> bool:
    """``b`` equals ``a`` within a relative 1e-5 (absolute 1e-6) for numbers, element by element for lists."""
    if isinstance(a, (int, float)) and not isinstance(a, bool) and isinstance(b, (int, float)):
        return abs(a - b) <= max(1e-5 * abs(a), 1e-6)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def assert_same_run(a: Path, b: Path, iterations: int = ITERATIONS) -> None:
    """The metrics at every step, the final weights and RNG state of two runs are the same; raises
    ``AssertionError`` naming the step and key, or the state, that differs."""
    ra, rb = metric_rows(a), metric_rows(b)
    assert sorted(ra) == sorted(rb), (sorted(ra), sorted(rb))
    for step, row in ra.items():
        for key, value in row.items():
            if value is None:
                assert rb[step].get(key, 0) is None, (step, key)
            else:
                assert _close(value, rb[step].get(key)), (step, key, value, rb[step].get(key))
    last = f"iter_{iterations:06d}"
    sa = torch.load(a / "checkpoints" / last / "trainer.pt", weights_only=True)
    sb = torch.load(b / "checkpoints" / last / "trainer.pt", weights_only=True)
    assert torch.equal(sa["rng"]["torch"], sb["rng"]["torch"]), "torch RNG state"
    assert torch.equal(sa["rng"]["numpy"]["key"], sb["rng"]["numpy"]["key"]), "numpy RNG state"
    assert sa["rng"]["python"] == sb["rng"]["python"], "python RNG state"
    pa = load_file(a / "checkpoints" / last / "policy" / "model.safetensors")
    pb = load_file(b / "checkpoints" / last / "policy" / "model.safetensors")
    assert pa.keys() == pb.keys() and all(torch.allclose(pa[k], pb[k], atol=1e-6) for k in pa), "policy weights"
