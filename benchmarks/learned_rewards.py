"""Learned rewards, measured: the success classifier's held-out accuracy, RL on the classifier alone, and the
process reward model's sample efficiency (task sampling: ``benchmarks/curriculum.py``).

Parts (``--parts``; each publishes ``learned_rewards_<part>`` through ``benchmarks/harness.py``):

- ``classifier``: on the quickstart env (``mujoco/pick-any``, front + wrist cameras, 64 px, the compact flow
  policy's inputs), record 400 training and 400 held-out episodes (other seeds) of the scripted expert with
  per-env action noise 0 / 0.5 / 1 / 2, train a classifier on the cameras + state and score the held-out
  episodes (episode accuracy, target >= 0.95; frame precision / recall). ``--policy_episodes N`` adds N episodes
  of the seed's pre-trained policy exploring, ``--counterfactual`` trains on every successful episode under
  another pick instruction as a failure, ``--images_only`` drops the arm state, ``--classifier NAME`` names the
  model's folder.
- ``ppo-classifier`` / ``bc-classifier``: ``vla-rl quickstart`` from the seed's pre-trained start with the reward
  replaced by ``{classifier: 1.0}`` (Flow-SDE PPO, or the quickstart's ``filtered_bc`` keeping the episodes the
  classifier calls successes); evaluation scores the simulator's success. Target: after - before >= +0.15.
- ``prm``: a process reward model (``stages`` labels) trained like the classifier; then two RL runs from the same
  start, ``{success: 1.0}`` and ``{success: 1.0, prm: <weight>}``, evaluated every ``--eval_every`` iterations on
  400 held-out episodes. Target: the PRM run reaches the sparse run's final success within 60% of its env steps
  and does not end below the sparse final's 95% interval (:func:`prm_ok`). Options set the term's form
  (``--prm_mode``), weight and annealing, the actor step, EMA evaluation, exploration noise, advantage
  normalization, run length and which arms run in this process (``--arms``: two processes side by side; a last
  call with both arms reads the finished runs).
- ``prm-replicate``: after ``prm`` with the same settings, a second sparse run per seed (RL seed + 100), and with
  ``--replicate_prm`` a second PRM run: the target read on the mean of two runs per arm.

Every RL part of a seed starts from that seed's one pre-trained policy (``<out>/pretrained-s<seed>``);
``--start_success R`` stops its imitation at the first success check that reaches R. Run alone
(``OMP_NUM_THREADS=1``); each quickstart RL run takes 10-25 minutes on 2 CPU cores. The weak-start PRM recipe::

    python benchmarks/learned_rewards.py --parts prm --start_success 0.15 --policy_episodes 200 \\
        --prm progress-v3 --counterfactual --prm_mode potential --no_adv_norm --explore_noise zero \\
        --iterations 400 --eval_every 40 --seeds 0 2 3 4 --out runs/weak
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import harness
import torch

NOISE = [0.0, 0.5, 1.0, 2.0]
HELD_OUT_SEED = 7_000_000
ARMS = ("prm", "sparse")  # the prm part's two runs per seed: PRM + success, success alone
PRESET_ITERATIONS = 200  # the quickstart_ppo preset's RL length: runs of another length are named -it<N>

@dataclasses.dataclass(frozen=True)
class Start:
    """Where every RL part of a seed starts: the task (an env id) and the pre-training that makes its policy (the
    ``quickstart_ppo`` preset's demos and imitation unless set)."""

    env_id: str = "mujoco/pick-any"
    demos: int = 0
    """Expert demos pre-trained on (0: the preset's, ``vla-rl quickstart``'s ``sft.episodes``)."""
    sft_steps: int = 0
    """Imitation steps (0: the preset's, ``sft.steps``)."""
    success: float = 0.0
    """> 0: stop the imitation at the first success check (64 episodes of its own seeds) that reaches this rate, so
    every seed starts near the same success instead of wherever its steps land (``--start_success``)."""
    check_every: int = 50
    """Imitation steps between those checks (the first after twice as many)."""

    def env(self, num_envs: int | None = None, workers: int | None = None) -> Any:
        """The quickstart's env config on this task (its cameras, image size and worker processes unless set)."""
        from vla_rl.commands.quickstart import _quickstart_env

        cfg = dataclasses.replace(_quickstart_env(), id=self.env_id)
        if num_envs is not None:
            cfg = dataclasses.replace(cfg, num_envs=num_envs)
        return cfg if workers is None else dataclasses.replace(cfg, num_workers=workers)

    def sft(self, base: Any) -> Any:
        """``base`` (the preset's SFTConfig) with this start's steps, demos and stop."""
        sft = dataclasses.replace(base, steps=self.sft_steps or base.steps, episodes=max(base.episodes, self.demos))
        if self.success:
            sft = dataclasses.replace(sft, stop_at_success=self.success, check_from=2 * self.check_every,
                                      check_every=self.check_every)
        return sft


def record(seed: int, episodes: int, desc: str, policy: str = "expert", start: Start = Start()) -> list[Any]:
    """Episodes of the scripted expert with action noise :data:`NOISE`, or of a policy folder (exploring), on the
    start's task."""
    from rewards.learned.data import record_episodes
    from vla_rl.commands.reward import _actor

    with start.env(num_envs=16, workers=0).make(seed=seed) as env:
        return record_episodes(env, _actor(policy, env, NOISE, seed), episodes, seed, desc=desc)


def pretrained(seed: int, out: Path, start: Start = Start()) -> Path:
    """The pre-trained policy of ``seed`` (:class:`Start`; no RL), its run folder: every RL part of ``seed`` starts
    from it. A folder made with another start is an error (its ``start.json`` says which)."""
    run = out / f"pretrained-s{seed}"
    marker = run / "start.json"
    if not (run / "report.json").exists():
        quickstart_run(seed, run, None, 0, 0, eval_episodes=1, start=start)
        marker.write_text(json.dumps(dataclasses.asdict(start)))
    made = Start(**json.loads(marker.read_text()))
    if made != start:
        raise SystemExit(f"{run} was pre-trained as {made}, not {start}: use another --out")
    return run


def model_path(kind: str, seed: int, out: Path) -> Path:
    return out / f"{kind}-s{seed}"


def model_row_path(kind: str, seed: int, out: Path) -> Path:
    """Where :func:`part_model` records its row (data, held-out metrics, times) beside the model it saved, so a part
    that finds the model already trained still reports how it was made."""
    return out / f"{kind}-s{seed}.json"


def part_model(kind: str, seed: int, episodes: int, epochs: int, out: Path, policy_episodes: int = 0,
               images_only: bool = False, name: str = "", start: Start = Start(), film: bool = True,
               counterfactual: bool = False) -> dict[str, Any]:
    """Train a classifier (or a stage-labelled progress model) and score it on held-out episodes: ``episodes`` of
    the noisy expert, plus ``policy_episodes`` of the seed's pre-trained policy exploring (its near misses and
    empty lifts are the negatives an RL policy would otherwise exploit), each for training and held out."""
    from rewards.learned.labels import milestone_targets, stage_targets, success_targets
    from rewards.learned.train import FitConfig, classifier_metrics, fit_reward_model, progress_metrics

    t0 = time.perf_counter()
    train = record(seed * 10_000, episodes, f"record train s{seed}", start=start)
    held = record(HELD_OUT_SEED + seed * 10_000, episodes, f"record held-out s{seed}", start=start)
    if policy_episodes:
        policy = str(pretrained(seed, out, start) / "sft_policy")
        train += record(seed * 10_000 + 5_000, policy_episodes, f"record policy train s{seed}", policy, start)
        held += record(HELD_OUT_SEED + seed * 10_000 + 5_000, policy_episodes, f"record policy held-out s{seed}",
                       policy, start)
    t1 = time.perf_counter()
    keys = [k for k in train[0].obs if k.startswith("observation.images.")] if images_only else []
    fit = FitConfig(epochs=epochs, holdout=0.0, seed=seed, keys=keys, film=film, counterfactual=counterfactual)
    if kind == "classifier":
        targets = [success_targets(e) for e in train]
    else:
        train, targets = milestone_targets(train, "stages")
    model, _, _ = fit_reward_model(kind, train, targets, fit, desc=f"fit {kind} s{seed}",
                                   relabel=stage_targets if kind == "progress" else None)
    t2 = time.perf_counter()
    if kind == "classifier":
        metrics = classifier_metrics(model, held)
    else:
        held, held_targets = milestone_targets(held, "stages")
        metrics = progress_metrics(model, held, held_targets)
    model.config.metrics = {"held_out": metrics}
    model.save(model_path(name or kind, seed, out))
    row = {"seed": seed, "train_episodes": len(train), "train_successes": sum(e.succeeded for e in train),
            **metrics, "record_s": t1 - t0, "fit_s": t2 - t1, "epochs": epochs,
            "policy_episodes": policy_episodes, "inputs": sorted(model.config.inputs),
            "reads_instruction": bool(model.config.vocabulary), "lr_schedule": fit.lr_schedule,
            "film": model.config.film, "counterfactual": fit.counterfactual,
            "path": str(model_path(name or kind, seed, out))}
    model_row_path(name or kind, seed, out).write_text(json.dumps(row, indent=1, default=str))
    return row


def quickstart_run(seed: int, run_dir: Path, reward: Any, iterations: int, eval_every: int,
                   sft_from: Path | None = None, eval_episodes: int = 400, preset: str = "quickstart_ppo",
                   env: Any = None, per_task: int = 0, start: Start | None = None, algo: dict[str, Any] | None = None,
                   rl_seed: int | None = None, ema: float = 0.0, eval_envs: int = 0, **fields: Any) -> dict[str, Any]:
    """``vla-rl quickstart`` (``preset``; empty = its defaults) with the RL stage's reward replaced by ``reward``
    (a RewardConfig; None = the preset's), the env by ``env`` (an EnvConfig), the evaluation by the ``per_task``
    protocol with that many episodes per task (0 = the quickstart's seeded episodes) and other QuickstartConfig
    ``fields`` set, and the preset's learner config with ``algo``'s fields; ``sft_from``: a run folder whose
    pre-trained policy this run starts from; ``start``: the task and pre-training of a run that pre-trains
    (:func:`pretrained`; its env unless ``env`` is given); ``rl_seed``: the RL stage's seed (its training episodes
    and sampling noise) in place of ``seed``, the evaluation keeping ``seed``'s held-out episodes; ``ema``: the RL
    stage evaluates this moving average of its weights (``--eval.ema``; 0: the weights as trained); ``eval_envs``:
    the evaluation's env count (0: the env's), which decides its held-out episodes, so runs on other env counts
    are read on the same episodes by setting it."""
    import shutil

    from vla_rl.cli import parse_config
    from vla_rl.commands import quickstart as qs

    original = qs._train_config

    def patched(cfg: Any, run: Path, policy_path: str) -> Any:
        train = original(cfg, run, policy_path)
        if reward is not None:
            train = dataclasses.replace(train, reward=reward)
        if rl_seed is not None:  # train.eval.seed is already seed's: replace() keeps it
            train = dataclasses.replace(train, seed=rl_seed)
        if per_task:
            train = dataclasses.replace(train, eval=dataclasses.replace(
                train.eval, protocol="per_task", episodes_per_task=per_task))
        if ema:
            train = dataclasses.replace(train, eval=dataclasses.replace(train.eval, ema=ema))
        if eval_envs:
            train = dataclasses.replace(train, eval=dataclasses.replace(train.eval, num_envs=eval_envs))
        return train

    qs._train_config = patched
    try:
        if sft_from is not None and not (run_dir / "sft_policy").exists():  # the same pre-trained start
            run_dir.mkdir(parents=True, exist_ok=True)
            shutil.copytree(sft_from / "sft_policy", run_dir / "sft_policy")
        # quickstart_ppo: the quickstart with its Flow-SDE PPO stage, where the reward drives the update
        # (filtered_bc, the default, reads success only)
        base = parse_config(qs.QuickstartConfig, ["--preset", preset] if preset else [])
        if start is not None:
            fields["sft"] = start.sft(base.sft)
            fields.setdefault("demos", max(base.demos, start.demos))
            env = env if env is not None else start.env()
        if algo:
            fields["algo"] = dataclasses.replace(base.algo, **algo)
        cfg = dataclasses.replace(
            base, seed=seed, run_dir=str(run_dir), iterations=iterations, eval_every=eval_every,
            resume=run_dir.exists(), eval_episodes=eval_episodes, env=env if env is not None else base.env,
            logging=dataclasses.replace(qs.LoggingConfig(), wandb=False, tensorboard=False), **fields)
        return qs.run_quickstart(cfg)
    finally:
        qs._train_config = original


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    """A run's logged rows (``metrics.jsonl``), in order."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def evals(rows: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """``[(env steps, eval success)]`` of a run's evaluations (its :func:`metrics` rows), in order."""
    return [(int(r["step"]), float(r["eval/success"])) for r in rows if "eval/success" in r]


def part_ppo_classifier(seed: int, out: Path, iterations: int, eval_episodes: int,
                        kind: str = "classifier", start: Start = Start(), learner: str = "ppo") -> dict[str, Any]:
    """RL with the classifier as the only reward from the seed's pre-trained start: ``learner`` ``ppo`` (the
    ``quickstart_ppo`` preset) or ``filtered_bc`` (the quickstart's own stage, imitating the episodes the
    classifier calls successes)."""
    from rewards import RewardConfig
    from rewards.learned.terms import ClassifierTermConfig

    clf = model_path(kind, seed, out)
    if not (clf / "config.json").exists():
        raise SystemExit(f"no classifier at {clf}: run --parts classifier first")
    reward = RewardConfig(terms={"classifier": 1.0}, classifier=ClassifierTermConfig(path=str(clf)))
    t0 = time.perf_counter()
    if learner == "ppo":
        run, preset, algo = out / f"ppo-{kind}-s{seed}", "quickstart_ppo", None
    else:  # a classifier success verdict pays 1 and ends the episode: return 1 is a success
        run, preset, algo = out / f"bc-{kind}-s{seed}", "", {"success_return": 1.0}
    s = quickstart_run(seed, run, reward, iterations, 0, eval_episodes=eval_episodes,
                       sft_from=pretrained(seed, out, start), preset=preset, algo=algo, env=start.env())
    n = s["episodes_per_eval"]
    return {"seed": seed, "before": s["success_before"], "after": s["success_after"],
            "gain": s["success_after"] - s["success_before"], "before_ci": s["success_before_ci"],
            "after_ci": s["success_after_ci"], "episodes": n, "env_steps": s["env_steps"],
            "classifier": str(clf), "learner": learner, "wall_s": time.perf_counter() - t0,
            "ok": s["success_after"] - s["success_before"] >= 0.15}


def part_prm(seed: int, out: Path, iterations: int, eval_every: int, weight: float,
             eval_episodes: int, episodes: int = 400, epochs: int = 8, start: Start = Start(),
             name: str = "progress", film: bool = True, counterfactual: bool = False,
             mode: str = "potential", policy_episodes: int = 0, anneal: float | None = None,
             lr_actor: float | None = None, ema: float = 0.0,
             sampler: dict[str, Any] | None = None, norm: bool = True, arms: tuple[str, ...] = ARMS,
             extend: int = 0, anneal_end: float = 1.0) -> dict[str, Any] | None:
    """The PRM + success run against the sparse run from the seed's pre-trained start (the PRM trained first if
    its folder is missing). ``lr_actor``: both runs' PPO actor step in place of the preset's (their folders named
    by it). ``ema``: both runs evaluate that moving average of their weights (their folders
    named by it). ``sampler``: both runs' Flow-SDE sampler fields in place of the preset's (``noise_level``,
    ``explore_noise``; folders named by them). ``norm`` False: both runs without PPO's per-rollout advantage
    normalization (``--algo.normalize_advantages false``; folders named ``-nonorm``). Runs of other than 200
    ``iterations`` are named ``-it<N>``. ``arms``: run only these of ``prm`` and ``sparse`` (one process per arm, side
    by side) and return None; the row needs both. ``extend`` N: the sparse arm continues its finished run of N
    iterations (run first if missing; copied, so it stays) to ``iterations``, as an interrupted run resumes: the
    first N iterations are that run's, and the envs are reset once at N. The PRM run's weight anneals over its own
    length, so it always starts fresh; ``anneal_end`` < 1 reaches ``anneal`` at that fraction of the run instead
    (``reward.anneal_end``). A finished run (its ``report.json``) is read, not run again."""
    from rewards import RewardConfig

    if extend and (not 0 < extend < iterations or iterations % eval_every or extend % eval_every):
        raise ValueError(f"--extend_sparse {extend}: must be under --iterations {iterations}, and both multiples of "
                         f"--eval_every {eval_every}")
    prm, model_row = model_path(name, seed, out), None
    if "prm" in arms:  # the sparse arm alone neither needs the PRM nor trains it
        recorded = model_row_path(name, seed, out)
        if not (prm / "config.json").exists():
            model_row = part_model("progress", seed, episodes, epochs, out, policy_episodes, name=name, film=film,
                                   counterfactual=counterfactual, start=start)
        elif recorded.exists():  # trained before: its recorded row, where there is one
            model_row = json.loads(recorded.read_text())
    t0 = time.perf_counter()
    sparse_dir = sparse_run(out, seed, lr_actor, ema=ema, sampler=sampler, norm=norm, iterations=iterations)
    mixed_dir = mixed_run(out, seed, name, mode, weight, anneal, lr_actor, ema, sampler, norm, iterations, anneal_end)
    algo = ({} if lr_actor is None else {"lr_actor": lr_actor}) | ({} if norm else {"normalize_advantages": False})
    run_arm = arm_runner(seed, out, start, eval_every, eval_episodes, algo, sampler, ema=ema)
    if "prm" in arms:
        run_arm(mixed_dir, prm_reward(prm, weight, mode, anneal, anneal_end), iterations)
    if "sparse" in arms:
        shorter = sparse_run(out, seed, lr_actor, ema=ema, sampler=sampler, norm=norm, iterations=extend)
        run_extended(run_arm, sparse_dir, RewardConfig(terms={"success": 1.0}), iterations, shorter, extend)
    if set(arms) != set(ARMS):
        return None
    sparse, mixed = evals(metrics(sparse_dir)), evals(metrics(mixed_dir))
    same_start(sparse_dir, sparse, mixed_dir, mixed)
    row = {"seed": seed, "start": sparse[0][1], "sparse_steps": sparse[-1][0], **compare(sparse, mixed, eval_episodes),
           "sparse_curve": sparse, "mixed_curve": mixed, "prm_weight": weight, "prm_mode": mode,
           "prm_anneal": anneal, "prm_anneal_end": anneal_end, "lr_actor": lr_actor, "ema": ema, "sampler": sampler,
           "normalize_advantages": norm,
           "wall_s": time.perf_counter() - t0, "prm": str(prm),
           "prm_model": model_row,  # each run's own wall time, also where it was read rather than run here
           "runs_wall_s": {run.name: json.loads((run / "report.json").read_text()).get("wall_seconds")
                           for run in (sparse_dir, mixed_dir)}}
    return row


def arm_runner(seed: int, out: Path, start: Start, eval_every: int, eval_episodes: int, algo: dict[str, Any],
               sampler: dict[str, Any] | None, **run: Any) -> Any:
    """``run_arm(run_dir, reward, iterations)`` for one arm of the ``prm`` and ``prm-replicate`` parts: a PPO run from
    the seed's pre-trained start (:func:`pretrained`) with ``algo``'s fields, ``sampler``'s Flow-SDE fields
    (:func:`preset_policy`) and ``run``'s other :func:`quickstart_run` arguments (``ema``, ``rl_seed``); a finished
    run (its ``report.json``) is read, not run again."""
    fields = {"policy": preset_policy(sampler)} if sampler else {}

    def run_arm(run_dir: Path, reward: Any, iterations: int) -> None:
        if not (run_dir / "report.json").exists():
            quickstart_run(seed, run_dir, reward, iterations, eval_every, eval_episodes=eval_episodes,
                           sft_from=pretrained(seed, out, start), env=start.env(), algo=algo, **run, **fields)

    return run_arm


def run_extended(run_arm: Any, run: Path, reward: Any, iterations: int, shorter: Path, extend: int) -> None:
    """``run_arm(run, reward, iterations)``; with ``extend`` N, ``run`` (where it does not exist yet) is first made as
    a copy of the finished N-iteration run ``shorter`` (run first if missing), so it resumes from there
    (``--extend_sparse``)."""
    if extend and not run.exists():
        run_arm(shorter, reward, extend)
        copy_run(shorter, run)
    run_arm(run, reward, iterations)


def copy_run(run: Path, dest: Path) -> None:
    """``run``'s folder copied to ``dest`` (through a temporary name, so a copy cut short is never taken for a run)
    without its ``report.json``, so the copy resumes from ``run``'s last checkpoint rather than being read as
    finished."""
    import shutil

    tmp = dest.with_name(dest.name + ".copying")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(run, tmp, ignore=shutil.ignore_patterns("report.json"))
    tmp.rename(dest)


def prm_reward(prm: Path, weight: float, mode: str, anneal: float | None, anneal_end: float = 1.0) -> Any:
    """The PRM + success run's RewardConfig: sparse success plus the process reward model at ``prm`` by ``weight``
    in form ``mode``, annealed to ``anneal`` by the last iteration, or by fraction ``anneal_end`` of the run (None:
    constant)."""
    from rewards import RewardConfig
    from rewards.learned.terms import ProgressTermConfig

    return RewardConfig(terms={"success": 1.0, "prm": weight}, prm=ProgressTermConfig(path=str(prm), mode=mode),
                        anneal={} if anneal is None else {"prm": anneal}, anneal_end=anneal_end)


def sparse_run(out: Path, seed: int, lr_actor: float | None = None, replicate: bool = False, ema: float = 0.0,
               sampler: dict[str, Any] | None = None, norm: bool = True, iterations: int = PRESET_ITERATIONS) -> Path:
    """The run folder of a sparse run of ``seed``: the ``prm`` part's (A), or with ``replicate`` the
    ``prm-replicate`` part's (B, RL seed + :data:`REPLICATE_SEED`); named by ``--lr_actor``, ``--ema`` and
    ``--noise_level``, ``--no_adv_norm`` and ``--iterations`` where set."""
    suffix = _run_suffix(lr_actor, ema, sampler, norm, iterations)
    return out / (f"prm-sparse{suffix}" + (f"-r{REPLICATE_SEED}" if replicate else "") + f"-s{seed}")


def _run_suffix(lr_actor: float | None, ema: float = 0.0, sampler: dict[str, Any] | None = None,
                norm: bool = True, iterations: int = PRESET_ITERATIONS) -> str:
    """``-lr<step>`` in a run folder's name for a run at another PPO actor step (``--lr_actor``), ``-ema<decay>``
    for one that evaluates the moving average of its weights (``--ema``) and ``-n<level>[z]`` for one that explores
    at another Flow-SDE noise level (``z``: chains from zero noise), ``-nonorm`` for one without advantage
    normalization (``--no_adv_norm``), ``-it<N>`` for one of other than the preset's 200 iterations; empty for the
    preset's runs."""
    noise = ""
    if sampler:
        level = sampler.get("noise_level", ppo_preset().policy.sampler.noise_level)
        noise = f"-n{level:g}" + ("z" if sampler.get("explore_noise") == "zero" else "")
    return (("" if lr_actor is None else f"-lr{lr_actor:g}") + (f"-ema{ema:g}" if ema else "") + noise
            + ("" if norm else "-nonorm") + ("" if iterations == PRESET_ITERATIONS else f"-it{iterations}"))


def preset_policy(sampler: dict[str, Any] | None) -> Any:
    """The ``quickstart_ppo`` preset's policy config with ``sampler``'s fields (``noise_level``, ``explore_noise``:
    a :class:`~policies.flow.sampler.InitialNoise` value) in its Flow-SDE sampler."""
    policy = ppo_preset().policy
    fields = dict(sampler or {})
    if "explore_noise" in fields:
        fields["explore_noise"] = type(policy.sampler.explore_noise)(fields["explore_noise"])
    return dataclasses.replace(policy, sampler=dataclasses.replace(policy.sampler, **fields))


def mixed_run(out: Path, seed: int, name: str, mode: str, weight: float, anneal: float | None,
              lr_actor: float | None = None, ema: float = 0.0, sampler: dict[str, Any] | None = None,
              norm: bool = True, iterations: int = PRESET_ITERATIONS, anneal_end: float = 1.0) -> Path:
    """The run folder of the PRM + success run of ``seed`` with these ``--prm*`` settings (``--prm``'s help)."""
    variant = (("" if name == "progress" else f"-{name}") + ("" if mode == "potential" else f"-{mode}")
               + ("" if weight == 1.0 else f"-w{weight:g}") + ("" if anneal is None else f"-a{anneal:g}")
               + ("" if anneal is None or anneal_end == 1.0 else f"-e{anneal_end:g}")
               + _run_suffix(lr_actor, ema, sampler, norm, iterations))
    return out / f"prm-mixed{variant}-s{seed}"


def compare(sparse: list[tuple[int, float]], other: list[tuple[int, float]], episodes: int = 400) -> dict[str, Any]:
    """The PRM target read on two runs' evaluations from one start: ``sparse``'s final is the level to reach,
    ``other`` the run that should reach it within 60% of the steps (:func:`prm_crossing`, :func:`prm_ok`)."""
    from vla_rl.evaluation import wilson_interval

    target, reached, ratio = prm_crossing(sparse, other)
    start_high = wilson_interval(round(sparse[0][1] * episodes), episodes)[1]
    row = {"sparse_final": target, "mixed_final": other[-1][1], "mixed_steps_to_sparse_final": reached,
           "step_ratio": ratio,
           # matching a sparse run that did not improve on the start (its final inside the start's 95% interval)
           # says nothing about sample efficiency
           "sparse_improved": target > start_high}
    row["ok"] = prm_ok(row, episodes)
    return row


REPLICATE_SEED = 100
"""``--parts prm-replicate``: the second sparse run of seed ``s`` trains with RL seed ``s + REPLICATE_SEED``."""


def part_prm_replicate(seed: int, out: Path, iterations: int, eval_every: int, eval_episodes: int,
                       start: Start, mixed_dir: Path, mixed_reward: Any = None, norm: bool = True, extend: int = 0,
                       arms: tuple[str, ...] = ARMS, sampler: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """A second sparse run (B) from the seed's pre-trained start, on the same held-out episodes as the ``prm``
    part's sparse run (A), differing only in the RL seed (its training episodes and sampling noise). B against A
    is the target's test on two runs that differ by chance alone; the PRM run (``mixed_dir``, where it exists) is
    also read against B and against the mean of A and B, a target less moved by one run's luck.

    ``mixed_reward`` (the PRM run's RewardConfig, :func:`prm_reward`): also a second PRM + success run with B's RL
    seed, so each arm has two runs, and the mean of the PRM runs is read against the mean of the sparse runs (the
    fair reading of the target at one start). ``norm``, ``extend`` and ``iterations`` are the ``prm`` part's
    (:func:`part_prm`): B is made as A was (without advantage normalization, extended from its own shorter run)
    and the PRM run B as the PRM run; so is ``sampler`` (both arms' Flow-SDE sampler fields). ``arms``: run only
    these of B's sparse and PRM runs (one process per arm) and return None. A finished run (its ``report.json``)
    is read, not run again."""
    from rewards import RewardConfig

    first = sparse_run(out, seed, sampler=sampler, norm=norm, iterations=iterations)
    if not (first / "metrics.jsonl").exists():
        raise SystemExit(f"no sparse run at {first}: run --parts prm with this --out first")
    t0 = time.perf_counter()
    second = sparse_run(out, seed, replicate=True, sampler=sampler, norm=norm, iterations=iterations)
    rl_seed = seed + REPLICATE_SEED
    mixed_b = mixed_dir.with_name(f"{mixed_dir.name.rsplit('-s', 1)[0]}-r{REPLICATE_SEED}-s{seed}")
    if mixed_reward is not None and not (mixed_dir / "metrics.jsonl").exists():
        raise SystemExit(f"no PRM + success run at {mixed_dir}: run --parts prm with these --prm* settings first")
    run_arm = arm_runner(seed, out, start, eval_every, eval_episodes, {} if norm else {"normalize_advantages": False},
                         sampler, rl_seed=rl_seed)
    if "sparse" in arms:
        shorter = sparse_run(out, seed, replicate=True, sampler=sampler, norm=norm, iterations=extend)
        run_extended(run_arm, second, RewardConfig(terms={"success": 1.0}), iterations, shorter, extend)
    if "prm" in arms and mixed_reward is not None:
        run_arm(mixed_b, mixed_reward, iterations)
    if set(arms) != set(ARMS):
        return None
    a, b = evals(metrics(first)), evals(metrics(second))
    same_start(first, a, second, b)
    mean = pooled_curve([a, b])
    row = {"seed": seed, "rl_seed": rl_seed, "start": a[0][1], "sparse_steps": a[-1][0],
           "a_curve": a, "b_curve": b, "b_vs_a": compare(a, b, eval_episodes), "a_vs_b": compare(b, a, eval_episodes),
           "mixed_run": mixed_dir.name, "normalize_advantages": norm, "extend": extend, "sampler": sampler,
           "wall_s": time.perf_counter() - t0}
    if (mixed_dir / "metrics.jsonl").exists():
        mixed = evals(metrics(mixed_dir))
        row.update(mixed_curve=mixed, prm_vs_a=compare(a, mixed, eval_episodes),
                   prm_vs_b=compare(b, mixed, eval_episodes), prm_vs_mean=compare(mean, mixed, eval_episodes))
        if mixed_reward is not None:
            mixed2 = evals(metrics(mixed_b))
            same_start(first, a, mixed_b, mixed2)
            row.update(mixed_b_run=mixed_b.name, mixed_b_curve=mixed2,
                       prm_b_vs_mean=compare(mean, mixed2, eval_episodes),
                       prm_mean_vs_mean=compare(mean, pooled_curve([mixed, mixed2]), eval_episodes))
    return row


def shares_start(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> bool:
    """Two runs' evaluations share their start's success and their env steps (they can be read against each
    other)."""
    return [step for step, _ in a] == [step for step, _ in b] and abs(a[0][1] - b[0][1]) <= 1e-9


def same_start(first: Path, a: list[tuple[int, float]], other: Path, b: list[tuple[int, float]]) -> None:
    """Stop unless two runs' evaluations share their start's success and their env steps."""
    if not shares_start(a, b):
        raise SystemExit(f"{first} and {other} do not share a start and evaluation steps (start {a[0][1]} vs "
                         f"{b[0][1]}; steps {[s for s, _ in a]} vs {[s for s, _ in b]}): use the prm run's "
                         "--iterations and --eval_every")


def prm_ok(row: dict[str, Any], episodes: int = 400) -> bool:
    """A PRM row meets the target: the sparse run improved on the start, the PRM run reached the sparse run's final
    within 60% of its env steps, and it did not end below the sparse final's 95% interval (a run that gets there
    early and then collapses is not a faster way to the same policy)."""
    from vla_rl.evaluation import wilson_interval

    low = wilson_interval(round(row["sparse_final"] * episodes), episodes)[0]
    ratio = row["step_ratio"]
    return bool(row["sparse_improved"] and not math.isnan(ratio) and ratio <= 0.6 and row["mixed_final"] >= low)


def prm_crossing(sparse: list[tuple[int, float]], mixed: list[tuple[int, float]]) -> tuple[float, int | None, float]:
    """``(target, steps, ratio)``: the sparse run's final success, the env steps of the PRM run's first evaluation
    after some RL (the step-0 one is the shared start) at or above it, and those steps over the sparse run's."""
    target = sparse[-1][1]
    reached = next((step for step, succ in mixed if step > 0 and succ >= target - 1e-9), None)
    return target, reached, (reached / sparse[-1][0] if reached is not None else float("nan"))


COLUMNS: dict[str, list[tuple[str, str]]] = {
    "classifier": [("seed", "seed"), ("episode accuracy", "episode_accuracy"), ("train episodes", "train_episodes"),
                   ("inputs", "inputs"), ("met", "ok")],
    "ppo-classifier": [("seed", "seed"), ("before", "before"), ("after", "after"), ("gain", "gain"),
                       ("episodes", "episodes"), ("met", "ok")],
    "prm": [("seed", "seed"), ("start", "start"), ("sparse final", "sparse_final"), ("PRM final", "mixed_final"),
            ("PRM env steps to sparse final", "mixed_steps_to_sparse_final"), ("of sparse steps", "step_ratio"),
            ("sparse improved", "sparse_improved"), ("met", "ok")],
    "prm-replicate": [("seed", "seed"), ("start", "start"), ("sparse B vs A: ratio", "b_vs_a.step_ratio"),
                      ("PRM vs mean of sparse: ratio", "prm_vs_mean.step_ratio"), ("met", "prm_vs_mean.ok"),
                      ("PRM mean vs sparse mean: ratio", "prm_mean_vs_mean.step_ratio"),
                      ("met", "prm_mean_vs_mean.ok")],
}
COLUMNS["bc-classifier"] = COLUMNS["ppo-classifier"]


def _cell(row: dict[str, Any], key: str) -> str:
    """``row``'s value at the dotted ``key``, formatted for a table ('-' where absent or not reached)."""
    value: Any = row
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list) and len(value) == 3 and all(isinstance(v, float) for v in value):
        return f"{value[0]:+.3f} [{value[1]:+.3f}, {value[2]:+.3f}]"
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)


def table(part: str, rows: list[dict[str, Any]]) -> str:
    """The part's markdown table, a row per seed (:data:`COLUMNS`)."""
    columns = COLUMNS[part]
    return harness.markdown_table([h for h, _ in columns], [[_cell(r, k) for _, k in columns] for r in rows])


def ppo_preset() -> Any:
    """The ``quickstart_ppo`` preset's QuickstartConfig, whose actor step and sampler the ``--lr_actor`` and
    ``--noise_level`` runs are named against."""
    from vla_rl.cli import parse_config
    from vla_rl.commands import quickstart as qs

    return parse_config(qs.QuickstartConfig, ["--preset", "quickstart_ppo"])


def preset_lr_actor() -> float:
    """The ``quickstart_ppo`` preset's PPO actor step."""
    return ppo_preset().algo.lr_actor


def pooled_curve(curves: list[list[tuple[int, float]]]) -> list[tuple[int, float]]:
    """The mean of several evaluation curves taken at the same env steps."""
    if any([step for step, _ in c] != [step for step, _ in curves[0]] for c in curves):
        raise ValueError(f"curves evaluated at different env steps: {[[step for step, _ in c] for c in curves]}")
    return [(step, sum(c[i][1] for c in curves) / len(curves)) for i, (step, _) in enumerate(curves[0])]


def main() -> None:
    from rewards.learned.terms import PRM_MODES

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", nargs="+", default=["classifier"],
                   choices=["classifier", "ppo-classifier", "bc-classifier", "prm", "prm-replicate"],
                   help="prm-replicate: after prm with the same --out and --prm* settings, a second sparse run per "
                        "seed with another RL seed (part_prm_replicate)")
    p.add_argument("--replicate_prm", action="store_true",
                   help="prm-replicate: also a second PRM + success run per seed with the second sparse run's RL "
                        "seed, read as the mean of two runs per arm")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--episodes", type=int, default=400, help="training and held-out episodes each (classifier)")
    p.add_argument("--epochs", type=int, default=8, help="classifier training epochs")
    p.add_argument("--policy_episodes", type=int, default=0,
                   help="classifier / prm: also this many episodes of the seed's pre-trained policy exploring, for "
                        "training and held out (labelled by the simulator, as an operator would label them, or by "
                        "its stage predicates)")
    p.add_argument("--images_only", action="store_true", help="classifier: read the cameras only (no arm state)")
    p.add_argument("--film", action=argparse.BooleanOptionalAction, default=True,
                   help="classifier / prm: the instruction modulates the CNN's channels (FitConfig.film)")
    p.add_argument("--counterfactual", action="store_true",
                   help="classifier / prm: training episodes relabelled with another instruction are added "
                        "(successes as failures; for the PRM every episode, with its stages recomputed) "
                        "(FitConfig.counterfactual)")
    p.add_argument("--classifier", default="classifier",
                   help="name of the classifier folder under --out (and of the results' part): e.g. classifier-v2")
    p.add_argument("--iterations", type=int, default=200, help="PPO iterations (the quickstart_ppo preset's length)")
    p.add_argument("--eval_every", type=int, default=20,
                   help="prm: evaluate every this many iterations (20 of 200: an evaluation falls on 60%% of the "
                        "sparse run's env steps, the target's line)")
    p.add_argument("--prm_weight", type=float, default=1.0)
    p.add_argument("--prm_anneal", type=float, default=None,
                   help="prm: the weight the prm term reaches at the run's last iteration, linearly from --prm_weight "
                        "(reward.anneal; names the mixed run -a<weight>)")
    p.add_argument("--prm_anneal_end", type=float, default=1.0,
                   help="prm: the fraction of the run's iterations by which --prm_anneal's weight is reached, and kept "
                        "from then on (reward.anneal_end; other than 1 names the mixed run -e<fraction>)")
    p.add_argument("--lr_actor", type=float, default=None,
                   help="prm: both runs' PPO actor step (default: the quickstart_ppo preset's); names their folders")
    p.add_argument("--ema", type=float, default=0.0,
                   help="prm: both runs evaluate (and checkpoint) this moving average of their weights (--eval.ema; "
                        "0: the weights as trained); names their folders -ema<decay>")
    p.add_argument("--noise_level", type=float, default=None,
                   help="prm: both runs explore at this Flow-SDE noise level (default: the quickstart_ppo preset's "
                        "0.5); names their folders -n<level>[z]")
    p.add_argument("--explore_noise", default=None, choices=["random", "zero"],
                   help="prm: where both runs' exploring chains start (default: the preset's random noise; zero: "
                        "where the deployed policy's chain starts)")
    p.add_argument("--no_adv_norm", action="store_true",
                   help="prm: both runs without PPO's per-rollout advantage normalization "
                        "(--algo.normalize_advantages false; folders named -nonorm)")
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS),
                   help="prm: run only these arms and write no row (one process per arm, side by side; a last "
                        "call with both reads the finished runs and writes the row)")
    p.add_argument("--extend_sparse", type=int, default=0, metavar="N",
                   help="prm: the sparse arm continues its finished run of N iterations (run first if missing) to "
                        "--iterations, as an interrupted run resumes, instead of starting fresh (the PRM run, "
                        "whose weight anneals over its length, always starts fresh)")
    p.add_argument("--prm", default="progress",
                   help="prm: name of the process reward model folder under --out (trained there if missing); the "
                        "sparse run is shared by every name, the mixed run is "
                        "prm-mixed-<name>[-<mode>][-w<weight>][-a<anneal>]-s<seed>")
    p.add_argument("--prm_mode", default="potential", choices=PRM_MODES,
                   help="prm: the term's form (reward.prm.mode): progress gained per chunk, or progress above the "
                        "episode's best so far (VLA-RL's milestones)")
    p.add_argument("--eval_episodes", type=int, default=400, help="held-out episodes per RL evaluation")
    p.add_argument("--start_success", type=float, default=0.0,
                   help="ppo-classifier / prm: stop each seed's imitation once a success check reaches this rate "
                        "(0 = the preset's steps), so the RL parts start near the same success on every seed")
    p.add_argument("--env", default="mujoco/pick-any",
                   help="classifier / ppo-classifier / prm: the task (an env id of the MuJoCo tabletop: its scripted "
                        "expert records the reward models' data and its stage predicates label them), e.g. "
                        "mujoco/stack-any, a four-stage task; --out must be a folder of its own")
    p.add_argument("--demos", type=int, default=0,
                   help="expert demos of the pre-trained start (0 = the quickstart_ppo preset's)")
    p.add_argument("--sft_steps", type=int, default=0,
                   help="imitation steps of the pre-trained start (0 = the preset's; --start_success may stop "
                        "it sooner)")
    p.add_argument("--check_every", type=int, default=50,
                   help="with --start_success: imitation steps between its success checks (the first after twice as "
                        "many)")
    p.add_argument("--out", default="runs/bench-rewards", help="models and runs go here")
    args = harness.add_output_args(p).parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    out = Path(args.out)
    start = Start(args.env, args.demos, args.sft_steps, args.start_success, args.check_every)
    for part in args.parts:
        rows = []
        for seed in args.seeds:
            t0 = time.perf_counter()
            if part == "classifier":
                row = part_model("classifier", seed, args.episodes, args.epochs, out, args.policy_episodes,
                                 args.images_only, args.classifier, start, args.film,
                                 args.counterfactual)
                row["ok"] = row["episode_accuracy"] >= 0.95
            elif part in ("ppo-classifier", "bc-classifier"):
                row = part_ppo_classifier(seed, out, args.iterations, args.eval_episodes, args.classifier,
                                          start, "ppo" if part == "ppo-classifier" else "filtered_bc")
            elif part == "prm-replicate":
                norm, sampler = not args.no_adv_norm, sampler_fields(args)
                mixed = mixed_run(out, seed, args.prm, args.prm_mode, args.prm_weight, args.prm_anneal,
                                  sampler=sampler, norm=norm, iterations=args.iterations,
                                  anneal_end=args.prm_anneal_end)
                reward = prm_reward(model_path(args.prm, seed, out), args.prm_weight, args.prm_mode,
                                    args.prm_anneal, args.prm_anneal_end) if args.replicate_prm else None
                row = part_prm_replicate(seed, out, args.iterations, args.eval_every, args.eval_episodes, start, mixed,
                                         reward, norm, args.extend_sparse, tuple(args.arms), sampler)
            else:
                row = part_prm(seed, out, args.iterations, args.eval_every, args.prm_weight, args.eval_episodes,
                               args.episodes, args.epochs, start, args.prm, args.film,
                               args.counterfactual, args.prm_mode, args.policy_episodes, args.prm_anneal,
                               args.lr_actor, args.ema, sampler_fields(args), not args.no_adv_norm,
                               tuple(args.arms), args.extend_sparse, args.prm_anneal_end)
            if row is None:  # prm or prm-replicate with one arm run alone: the row waits for the other
                print(f"{part} seed {seed}: {' and '.join(args.arms)} finished", flush=True)
                continue
            row["wall_s"] = time.perf_counter() - t0
            rows.append(row)
            print(json.dumps({part: row}, default=str)[:600], flush=True)
        if rows:
            harness.publish(f"learned_rewards_{part.replace('-', '_')}", args, table(part, rows), rows=rows,
                            summary={"load_average_at_end": os.getloadavg()[0]})


def sampler_fields(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--noise_level`` / ``--explore_noise`` as the sampler fields they set (None: neither given)."""
    fields = {k: v for k, v in (("noise_level", args.noise_level), ("explore_noise", args.explore_noise))
              if v is not None}
    return fields or None


if __name__ == "__main__":
    main()
