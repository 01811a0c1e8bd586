"""Learned rewards, measured: the success classifier's held-out accuracy, PPO on the classifier alone, the
process reward model's sample efficiency, and curriculum task selection against uniform sampling.

Parts (``--parts``; results merge into ``benchmarks/results/rewards.json`` part by part, seed by seed):

- ``classifier``: on the quickstart env (``mujoco/pick-any``, front + wrist cameras, 64 px, the compact flow
  policy's inputs), record 400 training episodes and 400 held-out episodes (other seeds) of the scripted expert
  with per-env action noise 0 / 0.5 / 1 / 2 (successes, near misses, failures), train a classifier on the
  cameras + state (privileged state excluded) and score the held-out episodes: *episode accuracy* (the
  classifier's verdict on the state each episode ended in vs the simulator's success; target >= 0.95) and
  frame precision / recall. Saves the classifier for the next part. ``--policy_episodes N`` adds N episodes of
  the seed's pre-trained policy exploring (training and held out; the negatives an RL policy reaches),
  ``--images_only`` drops the arm state from the inputs, ``--classifier NAME`` names the variant (its folder and
  its results section, e.g. ``classifier (classifier-v2)``); ``--counterfactual`` also trains on every successful
  training episode under another pick instruction, as a failure (FiLM, ``--film``, is on by default).
- ``ppo-classifier``: ``vla-rl quickstart`` (demos, few-shot imitation, Flow-SDE PPO, 400 held-out episodes
  before and after) with the reward replaced by ``{classifier: 1.0}``: the learner never sees the simulator's
  success or dense reward; evaluation scores the simulator's success. Target: after - before >= +0.15. The
  classifier's success verdict ends the episode (``reward.classifier.terminate``, its default).
- ``bc-classifier``: the same with the quickstart's own RL stage, success-filtered self-imitation
  (``filtered_bc``), whose kept episodes are those the classifier calls successes
  (``--algo.success_return 1``) instead of those the simulator does; same start, reward, evaluation and target.
- ``prm``: a process reward model (``stages`` labels) trained like the classifier; then two quickstart RL runs
  from the same pre-trained start, ``{success: 1.0}`` and ``{success: 1.0, prm: <weight>}``, evaluated every
  ``--eval_every`` iterations on 400 held-out episodes; reports the env steps at which the PRM run first
  reaches the sparse run's final success (target: <= 60% of the sparse run's steps, and the PRM run not ending
  below the sparse final's 95% interval: :func:`prm_ok`); ``--prm_mode`` picks the term's form. ``--prm NAME``
  names the PRM folder (another recipe, e.g. with ``--counterfactual``: every episode also under another
  instruction, its stages recomputed) and its mixed run; the sparse run is shared. ``--policy_episodes N`` adds N
  episodes of the seed's pre-trained policy (stage-labelled like the expert's) to the PRM's training and held-out
  data, so it has seen the states RL starts from; ``--prm_weight`` (default 1) other than 1 also names the mixed run,
  and so does ``--prm_anneal W`` (the prm weight moves linearly to ``W`` by the run's last iteration:
  ``reward.anneal``; with ``--prm_anneal_end F`` by fraction F of the run, named ``-e<F>``). ``--env`` runs it on
  another tabletop task, e.g. ``mujoco/stack-any`` (reach, grasp, lift,
  place: the single-skill task with the most stages), with its own pre-trained start (``--demos``, ``--sft_steps``,
  ``--start_success``, ``--check_every``) in an ``--out`` of its own. ``--lr_actor X`` runs both arms at PPO actor
  step X instead of the preset's (a dense reward may carry a larger step than the sparse one does), names their
  folders by it, and also reads the PRM run against the preset's own sparse runs under ``--out`` (run A, and the
  mean of A and the ``prm-replicate`` run B). ``--ema D`` evaluates (and checkpoints) both arms' moving average of
  the weights (``--eval.ema D``, :mod:`vla_rl.ema`) and names their folders ``-ema<D>``. ``--noise_level N``
  (with ``--explore_noise zero``) has both arms explore with Flow-SDE noise level N (chains from zero noise)
  instead of the preset's 0.5 from random noise, gentler exploration for tasks whose successes need centimetre
  placement, and names their folders ``-n<N>[z]``. ``--no_adv_norm`` runs both arms without PPO's per-rollout
  advantage normalization (``--algo.normalize_advantages false``; folders ``-nonorm``). ``--iterations N`` other
  than the preset's 200 names both arms' folders ``-it<N>``; ``--extend_sparse M`` has the sparse arm continue its
  finished M-iteration run (copied) to N, as an interrupted run resumes, rather than start fresh (the PRM run's
  weight anneals over its own length, so it starts fresh). ``--arms prm`` or ``--arms sparse`` runs one arm and
  writes no row, so the two arms of a seed run as two processes side by side; a last call with both arms reads the
  finished runs and writes the row. ``prm-replicate`` takes the same ``--no_adv_norm``, ``--iterations``,
  ``--extend_sparse``, ``--noise_level`` / ``--explore_noise`` and ``--arms`` (its B runs made as the ``prm``
  part's were).
- ``curriculum``: the quickstart's pipeline (demos, few-shot imitation, its default RL stage) on ``mujoco/multi``
  (12 tasks: pick, push and stack, of varied difficulty) from one pre-trained start per seed, one RL stage per
  ``--samplers`` entry (``uniform``, VLA-RL's ``curriculum``, ``progress``, ``balanced``) at the same iterations and env
  steps, each scored by the per-task protocol (``--per_task`` held-out episodes of every task; the headline is
  the mean over tasks, with its pooled 95% Wilson interval). Target: curriculum's mean over tasks above
  uniform's. Each run's ``task/<name>/success`` and ``task/<name>/weight`` curves go into the results.
- ``--reeval SECTION`` (runs nothing new): the final policies of a curriculum section's runs (their folders under
  ``--out``) evaluated again on ``--reeval_per_task`` episodes of every task (default 100), seeded like the runs'
  own evaluations, keeping each episode's outcome: the samplers then compare episode by episode on the same
  initial states (the paired difference from uniform, with its 95% interval), which 34 episodes per task and two
  separate Wilson intervals cannot resolve at the size of the differences measured.

Every RL part of a seed starts from that seed's one pre-trained policy (``<out>/pretrained-s<seed>``: the
``quickstart_ppo`` preset's demos and imitation steps). Its success differs by seed (0.32 / 0.58 / 0.37 on
seeds 0-2), and from 0.58 PPO gains little on any reward, the simulator's included (docs/benchmarks.md); so
``--start_success R`` stops each seed's imitation at the first success check (64 episodes) that reaches R, and
the parts then measure the reward, not PPO's ceiling. ``--tag TAG`` files a run's rows under ``<part> (TAG)``
so a variant of the settings does not overwrite the part's own rows.

Run alone for numbers worth recording (``OMP_NUM_THREADS=1``); on a 2-core CPU machine the classifier part
took 12-21 minutes per seed (contended), each quickstart RL run 10-25 minutes.

    python benchmarks/learned_rewards.py --parts classifier --seeds 0 1 2
    python benchmarks/learned_rewards.py --parts ppo-classifier --seeds 0 1 2
    python benchmarks/learned_rewards.py --parts classifier bc-classifier --classifier classifier-v2 \
        --images_only --policy_episodes 200 --seeds 0 1 2
    python benchmarks/learned_rewards.py --parts prm --seeds 0 1 2
    python benchmarks/learned_rewards.py --parts classifier ppo-classifier bc-classifier --classifier classifier-v5 \
        --counterfactual --policy_episodes 200 --seeds 0 1 2 3
    python benchmarks/learned_rewards.py --parts prm --prm progress-v2 --counterfactual --seeds 0 2 3 --tag progress-v2
    python benchmarks/learned_rewards.py --parts prm --prm progress-v2 --counterfactual --prm_mode milestone \
        --seeds 0 1 2 --tag "progress-v2, milestone"
    python benchmarks/learned_rewards.py --parts prm --env mujoco/stack-any --demos 200 --sft_steps 6000 \
        --start_success 0.25 --check_every 500 --policy_episodes 200 --prm progress-v3 --counterfactual \
        --prm_mode milestone --prm_weight 0.5 --prm_anneal 0 --eval_every 40 --seeds 0 1 2 --out runs/stack \
        --tag "stack-any, milestone, w 0.5 annealed to 0"
    python benchmarks/learned_rewards.py --parts prm prm-replicate --start_success 0.15 --policy_episodes 200 \
        --prm progress-v3 --counterfactual --prm_mode milestone --prm_weight 0.5 --prm_anneal 0 --eval_every 40 \
        --seeds 0 1 2 3 --out runs/weak --tag "start 0.15"
    python benchmarks/learned_rewards.py --parts prm-replicate --replicate_prm --start_success 0.15 \
        --prm progress-v3 --prm_mode milestone --prm_weight 0.5 --prm_anneal 0 --eval_every 40 \
        --seeds 0 1 2 3 --out runs/weak --tag "start 0.15, two runs per arm"
    python benchmarks/learned_rewards.py --parts prm --lr_actor 1e-4 --start_success 0.15 --prm progress-v3 \
        --prm_mode milestone --prm_weight 0.5 --prm_anneal 0 --eval_every 40 --seeds 0 1 2 --out runs/weak \
        --tag "start 0.15, actor step 1e-4"
    python benchmarks/learned_rewards.py --parts prm --ema 0.95 --start_success 0.15 --prm progress-v3 \
        --prm_mode milestone --prm_weight 0.5 --prm_anneal 0 --eval_every 40 --seeds 0 1 2 --out runs/weak \
        --tag "start 0.15, EMA 0.95"
    python benchmarks/learned_rewards.py --parts prm --env mujoco/pick-place-stack --demos 200 --sft_steps 6000 \
        --start_success 0.25 --check_every 500 --policy_episodes 200 --prm progress-v3 --prm_mode milestone \
        --prm_weight 0.5 --prm_anneal 0 --eval_every 40 --noise_level 0.25 --explore_noise zero --seeds 0 1 \
        --out runs/pps --tag "pick-place-stack, noise 0.25 from zero"
    python benchmarks/learned_rewards.py --parts curriculum --seeds 0 1 2
    python benchmarks/learned_rewards.py --reeval "curriculum (600 demos, 6000 steps, 400 it, balanced, session 39)" \
        --out /work/exp/s39/rw --reeval_per_task 100
    python benchmarks/learned_rewards.py --parts classifier ppo-classifier --classifier classifier-v2 \
        --images_only --policy_episodes 200 --start_success 0.35 --tag "classifier-v2, start 0.35" --out runs/weak
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # bench_report, also when imported rather than run as a script
sys.path.insert(0, str(ROOT))

from bench_report import write_json, write_section  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "rewards.json"
NOISE = [0.0, 0.5, 1.0, 2.0]
HELD_OUT_SEED = 7_000_000
CLASSIFIER_PARTS = ("classifier", "ppo-classifier", "bc-classifier")
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
        write_json(marker, dataclasses.asdict(start))
    if marker.exists():
        made = Start(**json.loads(marker.read_text()))
    else:  # folders made before Start existed recorded only the success target, on the quickstart's task
        old = run / "start_success.json"
        made = Start(success=json.loads(old.read_text())["start_success"] if old.exists() else 0.0)
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
    write_json(model_row_path(name or kind, seed, out), row)
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
    by it); the PRM run is then also read against the preset's own sparse runs where they exist (``vs_preset``:
    against ``prm-sparse-s<seed>``, and against its mean with the ``prm-replicate`` run B), the sparse reward at
    the step it learns best with. ``ema``: both runs evaluate that moving average of their weights (their folders
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
    if lr_actor is not None:
        row.update(vs_preset(out, seed, mixed, eval_episodes))
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


def vs_preset(out: Path, seed: int, mixed: list[tuple[int, float]], episodes: int) -> dict[str, Any]:
    """A PRM run at another actor step read against the preset's sparse runs of the seed under ``out`` (those that
    exist and share its start and evaluation steps): run A (``prm-sparse-s<seed>``) and, with B (the
    ``prm-replicate`` run), the mean of the two."""
    curves = [evals(metrics(d)) for d in (sparse_run(out, seed), sparse_run(out, seed, replicate=True))
              if (d / "metrics.jsonl").exists()]
    curves = [c for c in curves if shares_start(c, mixed)]
    if not curves:
        return {}
    row = {"preset_a_curve": curves[0], "vs_preset_a": compare(curves[0], mixed, episodes)}
    if len(curves) == 2:
        row.update(preset_b_curve=curves[1], vs_preset_mean=compare(pooled_curve(curves), mixed, episodes))
    return row


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


def trailing_means(curve: list[tuple[int, float]], window: int) -> list[tuple[int, float]]:
    """``[(step, mean of the success at this evaluation and the window - 1 before it)]`` (fewer at the start)."""
    out = []
    for i, (step, _) in enumerate(curve):
        recent = [succ for _, succ in curve[max(0, i - window + 1):i + 1]]
        out.append((step, sum(recent) / len(recent)))
    return out


def prm_crossing(sparse: list[tuple[int, float]], mixed: list[tuple[int, float]],
                 window: int = 1) -> tuple[float, int | None, float]:
    """``(target, steps, ratio)``: the sparse run's final success, the env steps of the PRM run's first evaluation
    after some RL (the step-0 one is the shared start) at or above it, and those steps over the sparse run's.
    ``window`` > 1 reads both curves as trailing means of that many evaluations (:func:`trailing_means`), a
    reading less moved by one evaluation's noise (400 episodes: about +-0.05) than the single-evaluation one
    (``window`` 1, the benchmark's target)."""
    sparse, mixed = trailing_means(sparse, window), trailing_means(mixed, window)
    target = sparse[-1][1]
    reached = next((step for step, succ in mixed if step > 0 and succ >= target - 1e-9), None)
    return target, reached, (reached / sparse[-1][0] if reached is not None else float("nan"))


def gradient_steps(rows: list[dict[str, Any]]) -> int | None:
    """The gradient steps a run's RL stage took (``update/steps`` of its :func:`metrics` rows, summed); None for a
    learner that does not log them (PPO)."""
    if not any("update/steps" in r for r in rows):
        return None
    return int(sum(r.get("update/steps", 0) or 0 for r in rows))


def rl_seconds(rows: list[dict[str, Any]]) -> float:
    """The seconds a run's RL iterations took (``time/iteration_s`` of its :func:`metrics` rows, summed): unlike the
    report's wall time, this covers every segment of a run that was resumed."""
    return float(sum(r.get("time/iteration_s", 0.0) or 0.0 for r in rows))


def task_curves(rows: list[dict[str, Any]], every: int = 20) -> dict[str, list[tuple[int, float, float]]]:
    """``{task: [(env steps, recent training success, sampling weight)]}`` from a run's ``task/*`` scalars (its
    :func:`metrics` rows), every ``every``-th iteration and the last."""
    curves: dict[str, list[tuple[int, float, float]]] = {}
    for row in rows:
        for key, value in row.items():
            if key.startswith("task/") and key.endswith("/success"):
                name = key[len("task/"):-len("/success")]
                curves.setdefault(name, []).append((int(row["step"]), float(value),
                                                    float(row.get(f"task/{name}/weight", float("nan")))))
    return {task: curve[::every] + ([curve[-1]] if (len(curve) - 1) % every else []) for task, curve in curves.items()}


def part_curriculum(seed: int, out: Path, iterations: int, per_task: int, demos: int, sft_steps: int,
                    samplers: list[str], min_buffer: int = 64, preset: str = "") -> dict[str, Any]:
    """The quickstart's pipeline on ``mujoco/multi`` (12 tasks: pick, push, stack), one pre-trained start, then
    one RL stage per task sampler at the same iterations (so the same env steps), each scored by the per-task
    protocol (``per_task`` episodes of every task, the headline is the mean over tasks). ``preset``: the
    quickstart preset whose RL stage runs (empty: the default, ``filtered_bc`` with ``min_buffer``;
    ``quickstart_ppo``: Flow-SDE PPO, the learner VLA-RL's curriculum was made for)."""
    from vla_rl.commands.quickstart import _quickstart_env
    from vla_rl.curriculum import TaskSamplingConfig
    from vla_rl.sft import SFTConfig

    t0 = time.perf_counter()
    rows: dict[str, Any] = {}
    first: Path | None = None
    for sampler in samplers:
        env = dataclasses.replace(_quickstart_env(), id="mujoco/multi", tasks=TaskSamplingConfig(sampler=sampler))
        run_dir = out / f"curriculum-{sampler}-s{seed}"
        done = run_dir / "report.json"  # a finished run of the same length is kept (add samplers to a seed later)
        s = json.loads(done.read_text()) if done.exists() else {}
        if s.get("iterations") != iterations:
            s = quickstart_run(seed, run_dir, None, iterations, 0, sft_from=first, env=env,
                               per_task=per_task, eval_episodes=12 * per_task, demos=demos,
                               sft=SFTConfig(steps=sft_steps, episodes=demos),
                               preset=preset, algo=None if preset else {"min_buffer": min_buffer})
        first = first or run_dir
        logged = metrics(run_dir)
        rows[sampler] = {  # per_task protocol: success is the mean over tasks, the interval pooled (equal counts)
            "before": s["success_before"], "after": s["success_after"], "before_ci": s["success_before_ci"],
            "after_ci": s["success_after_ci"], "episodes": s["episodes_per_eval"], "env_steps": s["env_steps"],
            "per_task_before": {t: r["success"] for t, r in s["per_task_before"].items()},
            "per_task_after": {t: r["success"] for t, r in s["per_task_after"].items()},
            "gradient_steps": gradient_steps(logged), "wall_s": s["wall_seconds"], "rl_s": rl_seconds(logged),
            "curves": task_curves(logged)}
    base = rows.get("uniform")
    out_row: dict[str, Any] = {"seed": seed, "iterations": iterations, "episodes_per_task": per_task,
                               "demos": demos, "sft_steps": sft_steps, "min_buffer": min_buffer, "preset": preset,
                               "arms": rows, "wall_s": time.perf_counter() - t0}
    if base is not None:
        for sampler, row in rows.items():
            if sampler != "uniform":
                out_row[f"{sampler}_minus_uniform"] = row["after"] - base["after"]
        out_row["ok"] = all(row["after"] > base["after"] for name, row in rows.items() if name != "uniform")
    return out_row


def evaluate_run(run_dir: Path, sampler: str, iterations: int, per_task: int) -> Any:
    """The final policy of the curriculum run ``run_dir`` (its last checkpoint, which must be ``iterations`` in and
    trained with ``sampler``), evaluated like the run's own last evaluation (its config's env, evaluation seed and
    executed steps) but on ``per_task`` held-out episodes of every task; an :class:`EvalResult` with ``outcomes``.

    Raises:
        SystemExit: naming the folder, for a run without checkpoints or of another sampler or length.
    """
    from policies.loading import load_policy
    from vla_rl.cli import parse_config
    from vla_rl.evaluation import evaluate_policy
    from vla_rl.train_config import TrainConfig
    from vla_rl.trainer import per_task_eval_tasks, task_curriculum

    latest = run_dir / "checkpoints" / "latest"
    if not latest.is_file():
        raise SystemExit(f"{run_dir}: no checkpoints/latest (not a finished curriculum run)")
    last = latest.parent / latest.read_text().strip()
    cfg = parse_config(TrainConfig, ["--config_path", str(last / "config.json")])
    if cfg.env.tasks.sampler != sampler or last.name != f"iter_{iterations:06d}":
        raise SystemExit(f"{last}: sampler {cfg.env.tasks.sampler} at {last.name}, but the results row is {sampler} at "
                         f"{iterations} iterations: --out points at other runs")
    policy = load_policy(last / "policy")
    policy.eval()
    with cfg.env.make(num_envs=cfg.eval.num_envs or cfg.env.num_envs, seed=cfg.eval.seed) as env:
        tasks = per_task_eval_tasks(cfg, task_curriculum(cfg, env.spec))  # the tasks the run's evaluation played
        if tasks is None:
            raise SystemExit(f"{last}: eval.protocol {cfg.eval.protocol}, not per_task: no episodes to pair by task")
        return evaluate_policy(env, policy, 0, cfg.eval.seed, cfg.exec_steps, tasks=tasks,
                               episodes_per_task=per_task, first_init=cfg.env.tasks.train_init_states,
                               desc=f"{run_dir.name} x{per_task}")


def reevaluate(key: str, runs: Path, seeds: list[int], per_task: int) -> None:
    """``--reeval``: every arm of the curriculum section ``key`` of ``rewards.json`` (the seeds given) gets its final
    policy's evaluation on ``per_task`` episodes of every task (:func:`evaluate_run`, run folders
    ``runs/curriculum-<sampler>-s<seed>``), with each episode's outcome so that the samplers pair up episode by
    episode (:func:`vla_rl.evaluation.paired_difference`). Arms already re-evaluated at ``per_task`` are kept; at the
    section's own ``episodes_per_task`` the evaluation must reproduce the row's success (a check of the set-up)."""
    from vla_core.manifest import exclusive

    results = json.loads(RESULTS.read_text())
    if key not in curriculum_keys(results):
        raise SystemExit(f"--reeval {key!r}: no such curriculum section in {RESULTS}; there are: "
                         + "; ".join(curriculum_keys(results)))
    for seed, row in _by_seed(results[key]):
        if int(seed) not in seeds:
            continue
        for sampler, arm in row["arms"].items():
            if arm.get("reeval", {}).get("episodes_per_task") == per_task:
                continue
            t0 = time.perf_counter()
            res = evaluate_run(runs / f"curriculum-{sampler}-s{seed}", sampler, row["iterations"], per_task)
            if per_task == row["episodes_per_task"] and abs(res.success_rate - arm["after"]) > 1e-9:
                raise SystemExit(f"seed {seed} {sampler}: re-evaluated {res.success_rate} is not the row's {arm['after']}: "
                                 "not the run's evaluation")
            entry = {"episodes_per_task": per_task, "success": res.success_rate, "ci": [res.ci_low, res.ci_high],
                     "episodes": res.episodes, "outcomes": res.outcomes, "wall_s": time.perf_counter() - t0,
                     "date": time.strftime("%Y-%m-%d"), "load_average_at_end": os.getloadavg()[0]}
            with exclusive(RESULTS, "the results file"):  # other re-evaluations may write it alongside
                fresh = json.loads(RESULTS.read_text())
                fresh[key]["seeds"][seed]["arms"][sampler]["reeval"] = entry
                write_json(RESULTS, fresh)
            print(f"seed {seed} {sampler}: {res.success_rate:.3f} [{res.ci_low:.3f}-{res.ci_high:.3f}] over "
                  f"{res.episodes} episodes, {entry['wall_s']:.0f} s", flush=True)


def _by_seed(section: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return sorted(section["seeds"].items(), key=lambda kv: int(kv[0]))


def _variant(key: str) -> str:
    """`` (classifier-v2)`` for a results section of a classifier variant (``--classifier``), else empty."""
    return f" ({key.split(' (', 1)[1]}" if " (" in key else ""


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _yes(row: dict[str, Any]) -> str:
    return "yes" if row.get("ok") else "no"


def _ci(ci: list[float]) -> str:
    return f"[{ci[0]:.2f}-{ci[1]:.2f}]"


def _conditions(section: dict[str, Any]) -> str:
    c = section.get("conditions", {})
    return (f"{c.get('machine', '?')}, torch {c.get('torch', '?')}, no GPU, OMP_NUM_THREADS={c.get('omp_threads')}, "
            f"{c.get('date', '?')}, load average {c.get('load_average_at_end', float('nan')):.1f} at the end")


def _preset_sft() -> Any:
    """The pre-training of the quickstart presets (``QuickstartConfig.sft``'s default: demos and steps)."""
    from vla_rl.commands.quickstart import QuickstartConfig

    return QuickstartConfig.__dataclass_fields__["sft"].default_factory()


def _start(section: dict[str, Any]) -> str:
    """Where a section's runs start, when not the quickstart's task and pre-training: its env and recipe."""
    args, default = section.get("conditions", {}).get("args", {}), Start()
    env = args.get("env", default.env_id)
    if env == default.env_id and not args.get("demos") and not args.get("sft_steps"):
        return ""
    preset = _preset_sft()
    demos, steps = args.get("demos") or preset.episodes, args.get("sft_steps") or preset.steps
    recipe = f"{demos} expert demos, {steps} imitation steps"
    if args.get("start_success"):
        recipe += (f" at most (stopped at the first 64-episode check, every "
                   f"{args.get('check_every', default.check_every)} steps, that reached {args['start_success']:g})")
    return f" On `{env}`; the pre-trained start: {recipe}."


def _explore(sampler: dict[str, Any]) -> str:
    """The sentence saying how a section's runs explore when ``--noise_level`` / ``--explore_noise`` changed it."""
    level = sampler.get("noise_level")
    level = f"at Flow-SDE noise level {level:g}" if level is not None else "at the preset's noise level"
    where = {"zero": "chains from zero noise", "random": "chains from random noise"}.get(
        sampler.get("explore_noise"), "chains from the preset's random noise")
    preset = ppo_preset().policy.sampler
    return (f"Both runs explore {level}, {where} (`--policy.sampler.noise_level`, `explore_noise`), not the "
            f"preset's {preset.noise_level:g} from {preset.explore_noise.value} noise.")


def _ratio(value: float) -> str:
    """A step ratio for a table: '-' where the PRM run never reached the sparse final."""
    return "-" if math.isnan(value) else f"{value:.2f}"


def plot_name(key: str) -> str:
    """The image of a results section: ``<part>.png`` (``curriculum.png``, ``prm.png``), or ``<part>-<tag slug>.png``
    for a tagged section."""
    part = key.split(" (", 1)[0]
    tag = key.split(" (", 1)[1].rstrip(")") if " (" in key else ""
    return f"{part}-{re.sub(r'[^a-z0-9]+', '-', tag.lower()).strip('-')}.png" if tag else f"{part}.png"


def _curriculum_learner(row: dict[str, Any]) -> str:
    """What a curriculum row's RL stage was, for its section's text."""
    if row.get("preset"):
        return f"the `{row['preset']}` preset's learner, `vla-rl quickstart --preset {row['preset']}`"
    return f"the quickstart's default `filtered_bc`, `min_buffer` {row.get('min_buffer', 256)}"


def curriculum_keys(results: dict[str, Any]) -> list[str]:
    """The curriculum sections of ``rewards.json`` (``curriculum`` and ``curriculum (<tag>)``)."""
    return [k for k in results if k.split(" (")[0] == "curriculum"]


def has_curves(section: dict[str, Any]) -> bool:
    """Whether the lowest seed of a curriculum section logged per-task curves (what :func:`plot_curriculum` draws)."""
    return any(a.get("curves") for a in _by_seed(section)[0][1]["arms"].values())


def plot_curriculum(section: dict[str, Any], path: Path) -> None:
    """Per task, the recent training success of each sampler's run (the lowest seed), and the task weights of the
    first sampler that is not uniform."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    row = _by_seed(section)[0][1]
    arms = row["arms"]
    fig, axes = plt.subplots(1, len(arms) + 1, figsize=(4.2 * (len(arms) + 1), 3.4), squeeze=False)
    for ax, (sampler, arm) in zip(axes[0], arms.items()):
        for task, curve in sorted(arm["curves"].items()):
            ax.plot([c[0] / 1e3 for c in curve], [c[1] for c in curve], lw=1, label=task)
        ax.set_title(f"{sampler}: recent training success", fontsize=9)
        ax.set_xlabel("env steps (k)")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    curved = next((a for name, a in arms.items() if name != "uniform"), None)
    ax = axes[0][-1]
    if curved is not None:
        for task, curve in sorted(curved["curves"].items()):
            ax.plot([c[0] / 1e3 for c in curve], [c[2] for c in curve], lw=1, label=task)
    ax.set_title("task weight (non-uniform sampler)", fontsize=9)
    ax.set_xlabel("env steps (k)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def prm_keys(results: dict[str, Any]) -> list[str]:
    """The process reward model sections of ``rewards.json`` (``prm`` and ``prm (<tag>)``)."""
    return [k for k in results if k.split(" (")[0] == "prm"]


PRM_CURVES = (("sparse", "sparse_curve"), ("PRM + success", "mixed_curve"),
              ("sparse, preset step, A", "preset_a_curve"), ("sparse, preset step, B", "preset_b_curve"))
REPLICATE_CURVES = (("sparse A", "a_curve"), (f"sparse B (RL seed + {REPLICATE_SEED})", "b_curve"),
                    ("PRM + success", "mixed_curve"),
                    (f"PRM + success B (RL seed + {REPLICATE_SEED})", "mixed_b_curve"))


def replicate_keys(results: dict[str, Any]) -> list[str]:
    """The ``prm-replicate`` sections of ``rewards.json`` (:func:`part_prm_replicate`)."""
    return [k for k in results if k.split(" (")[0] == "prm-replicate"]


def plot_prm(section: dict[str, Any], path: Path, curves: tuple[tuple[str, str], ...] = PRM_CURVES) -> None:
    """Per seed, the held-out success of each run in ``curves`` (label, row field; a row without the field skips
    it) against env steps, with the first run's final (the level to reach) and 60% of its env steps (where to
    reach it by)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _by_seed(section)
    fig, axes = plt.subplots(1, len(rows), figsize=(3.6 * len(rows), 3.2), squeeze=False, sharey=True)
    for ax, (seed, r) in zip(axes[0], rows):
        for name, field in curves:
            if r.get(field):
                curve = r[field]
                ax.plot([c[0] / 1e3 for c in curve], [c[1] for c in curve], marker="o", ms=3, lw=1.2, label=name)
        ax.axhline(r[curves[0][1]][-1][1], color="grey", lw=0.8, ls="--")
        ax.axvline(0.6 * r["sparse_steps"] / 1e3, color="grey", lw=0.8, ls=":")
        ax.set_title(f"seed {seed}", fontsize=9)
        ax.set_xlabel("env steps (k)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out success (400 episodes)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ppo_preset() -> Any:
    """The ``quickstart_ppo`` preset's QuickstartConfig, whose actor step and sampler the ``--lr_actor`` and
    ``--noise_level`` runs are named and read against."""
    from vla_rl.cli import parse_config
    from vla_rl.commands import quickstart as qs

    return parse_config(qs.QuickstartConfig, ["--preset", "quickstart_ppo"])


def preset_lr_actor() -> float:
    """The ``quickstart_ppo`` preset's PPO actor step, which ``--lr_actor`` runs are read against."""
    return ppo_preset().algo.lr_actor


def prm_summary(results: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every ``prm`` section's rows read together: per section, its seeds, the rows whose sparse run improved
    (the only ones that can meet the target), how many of those met it (:func:`prm_ok`) and their seeds' step
    ratios (NaN: never reached); and the same pooled over every section, with the median ratio (a row that never reached
    the sparse final counts as above every ratio)."""
    per_section = []
    for key in prm_keys(results):
        rows = _by_seed(results[key])
        readable = [(seed, r) for seed, r in rows if r["sparse_improved"]]
        per_section.append({"section": key, "seeds": len(rows), "readable": len(readable),
                            "met": sum(prm_ok(r) for _, r in readable),
                            "ratios": [(seed, r["step_ratio"]) for seed, r in readable]})
    ratios = [ratio for s in per_section for _, ratio in s["ratios"]]
    total = {"seeds": sum(s["seeds"] for s in per_section), "readable": len(ratios),
             "met": sum(s["met"] for s in per_section), "never": sum(math.isnan(r) for r in ratios),
             "median_ratio": statistics.median([math.inf if math.isnan(r) else r for r in ratios]) if ratios
             else float("nan")}
    return per_section, total


def render_prm_summary(results: dict[str, Any]) -> list[str]:
    """The table of :func:`prm_summary`: the PRM target over every section at once."""
    per_section, total = prm_summary(results)
    if not per_section:
        return []
    out = ["", "### Process reward model: every section read together", "",
           "Each `prm` section above, one line: its seeds, those whose sparse run improved on the start (only they "
           "can meet the target), how many of those met it, and their step ratios (- : the PRM run never reached the "
           "sparse final). Sections differ in recipe, start and task, and a few share runs (a section re-read at "
           "another evaluation grid, or a sparse run reused), so the pooled line counts rows, not independent runs.",
           "", "| section | seeds | sparse improved | met | ratios where it improved |", "|---|---:|---:|---:|---|"]
    for s in per_section:
        ratios = ", ".join(f"s{seed} {_ratio(r)}" for seed, r in s["ratios"]) or "-"
        out.append(f"| {s['section']} | {s['seeds']} | {s['readable']} | {s['met']} | {ratios} |")
    median = total["median_ratio"]
    shown = "-" if math.isnan(median) else ("never reached" if math.isinf(median) else f"{median:.2f}")
    out.append(f"| **all** | {total['seeds']} | {total['readable']} | {total['met']} | median {shown}; "
               f"{total['never']} never reached |")
    return out


def render_vs_preset(sec: dict[str, Any]) -> list[str]:
    """For a ``prm`` section run at another actor step (``--lr_actor``): its PRM runs read against the preset's
    sparse runs of the same start (:func:`vs_preset`), A alone and the mean of A and B; empty if it has none."""
    rows = [(seed, r) for seed, r in _by_seed(sec) if r.get("vs_preset_a")]
    if not rows:
        return []

    def cells(c: dict[str, Any] | None) -> str:
        if c is None:
            return "- | - | - | -"
        reached = c["mixed_steps_to_sparse_final"]
        return (f"{c['sparse_final']:.3f} | {'-' if reached is None else f'{reached:,}'} | {_ratio(c['step_ratio'])} "
                f"| {'yes' if c['ok'] else 'no'}")

    out = ["", f"The same PRM runs against the preset's sparse runs from the same start (actor step "
           f"{preset_lr_actor():g}, the step the sparse reward learns best with: larger steps hurt it, \"RL ceiling on "
           "`mujoco/pick-any`\"): its run A, and the mean of A and B (B: RL seed + "
           f"{REPLICATE_SEED}, `--parts prm-replicate`).", "",
           "| seed | A final | PRM steps to it | ratio | met | mean of A and B final | PRM steps to it | ratio | met |",
           "|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    out += [f"| {seed} | {cells(r['vs_preset_a'])} | {cells(r.get('vs_preset_mean'))} |" for seed, r in rows]
    return out


def render_replicate(key: str, sec: dict[str, Any]) -> list[str]:
    """The table of a ``prm-replicate`` section: two sparse runs from one start read against each other by the PRM
    target, and the PRM run read against each and against their mean; then how often each reading met it."""
    rows = _by_seed(sec)
    readings = {"b_vs_a": "B vs A", "a_vs_b": "A vs B", "prm_vs_a": "PRM vs A", "prm_vs_b": "PRM vs B",
                "prm_vs_mean": "PRM vs mean"}

    def cell(r: dict[str, Any], name: str) -> str:
        c = r.get(name)
        return "- | -" if c is None else f"{_ratio(c['step_ratio'])} | {'yes' if c['ok'] else 'no'}"

    out = ["", f"### Sparse against sparse: a second RL seed{_variant(key)}", "",
           f"`--parts prm-replicate`: per seed, a second sparse run (B: `{{success: 1.0}}`, RL seed = seed + "
           f"{REPLICATE_SEED}, so "
           "other training episodes and sampling noise) from the same pre-trained start as the `prm` part's sparse "
           "run (A) under the same `--out`, evaluated on the same 400 held-out episodes at the same env steps."
           f"{_start(sec)}{_replicate_setup(rows[0][1])} {_conditions(sec)}."
           + (f" {sec['note']}" if sec.get("note") else ""), "",
           "*B vs A*: the PRM table's target with B in the PRM run's place (A improved on the start, B reaches A's "
           "final within 60% of the env steps and does not end below its 95% interval); *A vs B* the other way "
           "round. The two differ by chance alone, so a target met this way is one a single pair of runs meets by "
           "luck. *PRM vs A / B / mean*: the PRM run of the same seed and start (`"
           f"{rows[0][1]['mixed_run'].rsplit('-s', 1)[0]}-s<seed>`) read against A (the PRM table's row), against B, "
           "and against the mean curve of A and B (intervals at 400 episodes).", "",
           "| seed | start | A final | B final | B vs A: ratio | met | A vs B: ratio | met | PRM final | PRM vs A: "
           "ratio | met | PRM vs B: ratio | met | mean of A, B: final | PRM vs mean: ratio | met |",
           "|---:|---:|---:|---:|---:|---|---:|---|---:|---:|---|---:|---|---:|---:|---|"]
    for seed, r in rows:
        mixed = f"{r['mixed_curve'][-1][1]:.3f}" if r.get("mixed_curve") else "-"
        mean = (r["a_curve"][-1][1] + r["b_curve"][-1][1]) / 2
        out.append(f"| {seed} | {r['start']:.3f} | {r['a_curve'][-1][1]:.3f} | {r['b_curve'][-1][1]:.3f} | "
                   f"{cell(r, 'b_vs_a')} | {cell(r, 'a_vs_b')} | {mixed} | {cell(r, 'prm_vs_a')} | "
                   f"{cell(r, 'prm_vs_b')} | {mean:.3f} | {cell(r, 'prm_vs_mean')} |")
    counts = []
    for name, label in readings.items():
        read = [r[name] for _, r in rows if r.get(name)]
        counts.append(f"{label} {sum(c['ok'] for c in read)} of {len(read)}")
    out += ["", "Met: " + "; ".join(counts) + "."]
    two_per_arm = any(r.get("mixed_b_curve") for _, r in rows)
    if two_per_arm:
        out += render_two_per_arm(sec)
    what = "both sparse runs and both PRM runs" if two_per_arm else "both sparse runs and the PRM run"
    return out + ["", f"![held-out success of {what} per seed](img/{plot_name(key)})"]


def _replicate_setup(row: dict[str, Any]) -> str:
    """How a ``prm-replicate`` section's B runs were made where not as the preset's: without advantage
    normalization, extended from their own shorter run as A was, exploring with another Flow-SDE sampler
    (``--no_adv_norm``, ``--extend_sparse``, ``--noise_level`` / ``--explore_noise``)."""
    text = f" {_explore(row['sampler'])}" if row.get("sampler") else ""
    if row.get("normalize_advantages") is False:
        text += (" Every run uses PPO's advantages as they come, without normalizing them over each rollout "
                 "(`--algo.normalize_advantages false`).")
    if row.get("extend"):
        text += (f" B, as A, ran {row['extend']} iterations and was then continued from that run's last checkpoint "
                 f"to A's length, {row['sparse_steps']:,} env steps (`--extend_sparse {row['extend']}`).")
    return text


def render_two_per_arm(sec: dict[str, Any], episodes: int = 400) -> list[str]:
    """The rows of a ``prm-replicate --replicate_prm`` section with two runs per arm: the PRM target read on the
    mean curve of the two PRM runs against the mean curve of the two sparse runs, per seed and over every seed's
    runs together."""
    rows = [(seed, r) for seed, r in _by_seed(sec) if r.get("mixed_b_curve")]
    out = ["", f"Two runs per arm: a second PRM + success run per seed (RL seed = seed + {REPLICATE_SEED}, B's), "
           "so each arm is the mean of two runs that differ only by RL seed. *PRM mean vs sparse mean*: the target "
           "read on the two mean curves (the sparse mean improved on the start, the PRM mean reaches its final within "
           f"60% of the env steps and does not end below its 95% interval at {episodes} episodes). *All seeds*: the "
           f"same reading on the mean of every seed's runs ({2 * len(rows)} runs per arm, intervals at "
           f"{2 * len(rows) * episodes} episodes).", "",
           "| seed | start | sparse A | sparse B | sparse mean | PRM A | PRM B | PRM mean | "
           "PRM B vs sparse mean: ratio | met | PRM mean vs sparse mean: ratio | met |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|"]
    sparse_means, prm_means = [], []
    for seed, r in rows:
        sparse_mean = pooled_curve([r["a_curve"], r["b_curve"]])
        prm_mean = pooled_curve([r["mixed_curve"], r["mixed_b_curve"]])
        sparse_means.append(sparse_mean)
        prm_means.append(prm_mean)
        b, m = r["prm_b_vs_mean"], r["prm_mean_vs_mean"]
        out.append(f"| {seed} | {r['start']:.3f} | {r['a_curve'][-1][1]:.3f} | {r['b_curve'][-1][1]:.3f} | "
                   f"{sparse_mean[-1][1]:.3f} | {r['mixed_curve'][-1][1]:.3f} | {r['mixed_b_curve'][-1][1]:.3f} | "
                   f"{prm_mean[-1][1]:.3f} | {_ratio(b['step_ratio'])} | {'yes' if b['ok'] else 'no'} | "
                   f"{_ratio(m['step_ratio'])} | {'yes' if m['ok'] else 'no'} |")
    all_sparse = pooled_curve(sparse_means)
    pooled = compare(all_sparse, pooled_curve(prm_means), 2 * len(rows) * episodes)
    met_all = "yes" if pooled["ok"] else "no"
    out.append(f"| all seeds | {all_sparse[0][1]:.3f} | | | {pooled['sparse_final']:.3f} | | | "
               f"{pooled['mixed_final']:.3f} | | | {_ratio(pooled['step_ratio'])} | {met_all} |")
    met = sum(r["prm_mean_vs_mean"]["ok"] for _, r in rows)
    return out + ["", f"Met (PRM mean vs sparse mean): {met} of {len(rows)} seeds; over all seeds: {met_all}."]


def pooled_curve(curves: list[list[tuple[int, float]]]) -> list[tuple[int, float]]:
    """The mean of several evaluation curves taken at the same env steps."""
    if any([step for step, _ in c] != [step for step, _ in curves[0]] for c in curves):
        raise ValueError(f"curves evaluated at different env steps: {[[step for step, _ in c] for c in curves]}")
    return [(step, sum(c[i][1] for c in curves) / len(curves)) for i, (step, _) in enumerate(curves[0])]


def render(results: dict[str, Any]) -> str:
    """The ``## Learned rewards (issue 19)`` section: one table per part present in ``results``."""
    from vla_rl.evaluation import wilson_interval

    out = ["Numbers: `benchmarks/results/rewards.json`; rendered by `python benchmarks/learned_rewards.py --render "
           "docs/benchmarks.md`. Readings: the next section."]
    for key in [k for k in results if k.split(" (")[0] == "classifier"]:
        sec = results[key]
        first = _by_seed(sec)[0][1]
        extra = first.get("policy_episodes", 0)
        reads = ("the cameras only" if first.get("inputs") and "observation.state" not in first["inputs"]
                 else "the cameras and `observation.state`")
        if first.get("reads_instruction"):
            reads = reads.replace(" only", "") + " and the instruction's words" + (
                " (which also scale and shift the CNN's channels: FiLM)" if first.get("film") else "")
        swaps = ("; every successful training episode also trains again under another pick instruction, as a "
                 "failure" if first.get("counterfactual") else "")
        schedule = ", the learning rate decaying to 0 along a cosine" if first.get("lr_schedule") == "cosine" else ""
        args = sec.get("conditions", {}).get("args", {})
        expert = args.get("episodes", 400)
        out += ["", f"### Success classifier{_variant(key)}", "",
                "`--parts classifier`: on `mujoco/pick-any` (front + wrist cameras at 64 px, the compact policy's "
                f"inputs), {expert} training and {expert} held-out episodes (other reset seeds) of the scripted expert "
                "with per-env action noise cycling through 0 / 0.5 / 1 / 2"
                + (f", plus {extra} training and {extra} held-out episodes of the seed's pre-trained policy exploring"
                   if extra else "")
                + "; a classifier (shared 3-layer CNN per camera + state MLP, width 32) trained "
                f"{args.get('epochs', 8)} epochs on {reads} (never the privileged state){schedule}{swaps}. *Episode accuracy*: its "
                "verdict on each held-out episode's final observation against the simulator's success. *First "
                "verdict*: the episode called a success if any of its frames is judged one, which is where a "
                "terminating `classifier` reward asked after every step would end it (failures called success: "
                f"how many failed episodes it fires on somewhere; - where not measured). {_conditions(sec)}.", "",
                "| seed | train successes | held-out successes | episode accuracy [95% CI] | first verdict [95% CI] | "
                "failures called success | frame precision | frame recall | frame accuracy | held-out frames | "
                "record + fit s | >= 0.95 |",
                "|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---|"]
        for seed, r in _by_seed(sec):
            n, k = r["episodes"], round(r["episode_accuracy"] * r["episodes"])
            first_verdict, called = "-", "-"
            if "first_verdict_accuracy" in r:
                kf = round(r["first_verdict_accuracy"] * n)
                first_verdict = f"{r['first_verdict_accuracy']:.3f} {_ci(list(wilson_interval(kf, n)))}"
                called = f"{r['failures_called_success']}/{n - r['successful_episodes']}"
            out.append(f"| {seed} | {r['train_successes']}/{r['train_episodes']} | {r['successful_episodes']}/{n} | "
                       f"{r['episode_accuracy']:.3f} {_ci(list(wilson_interval(k, n)))} | {first_verdict} | {called} | "
                       f"{r['precision']:.2f} | "
                       f"{r['recall']:.3f} | {r['accuracy']:.3f} | {r['frames']} | {r['record_s']:.0f} + "
                       f"{r['fit_s']:.0f} | {_yes(r)} |")
    for key in [k for k in results if k.split(" (")[0] in ("ppo-classifier", "bc-classifier")]:
        sec = results[key]
        bc = key.startswith("bc-")
        what = ("`--parts bc-classifier`: `vla-rl quickstart` (its own RL stage, success-filtered self-imitation for "
                "200 iterations, `--algo.success_return 1`: it imitates the episodes the classifier calls successes)"
                if bc else "`--parts ppo-classifier`: `vla-rl quickstart --preset quickstart_ppo` (demos, few-shot "
                "imitation, Flow-SDE PPO for 200 iterations)")
        out += ["", f"### {'filtered_bc' if bc else 'PPO'} with the classifier as its only reward{_variant(key)}", "",
                f"{what}, from the seed's pre-trained start (the `quickstart_ppo` preset's demos and imitation), "
                "with the reward replaced by `{classifier: 1.0}` (the seed's "
                "classifier above): the learner never sees the simulator's success or dense reward; the 400 "
                "held-out episodes before and after are scored by the simulator's success (deterministic policy, "
                f"95% Wilson interval). *Simulator-reward gain*: PPO from the same start on the simulator's "
                "own success (`{success: 1.0}`, the `prm` part's sparse run, where measured). "
                f"{_conditions(sec)}.", "",
                "| seed | success before [95% CI] | success after [95% CI] | gain | simulator-reward gain | episodes | "
                "env steps | wall s | >= +0.15 |", "|---:|---|---|---:|---:|---:|---:|---:|---|"]
        # a sparse run of the same seed from the same start (any prm section: pre-training is deterministic per seed)
        sparse = [row for key in prm_keys(results) for row in results[key]["seeds"].values()]
        for seed, r in _by_seed(sec):
            ref = next((x for x in sparse if x["seed"] == int(seed) and abs(x["start"] - r["before"]) < 1e-9), None)
            oracle = f"{ref['sparse_final'] - ref['start']:+.3f}" if ref else "-"
            out.append(f"| {seed} | {r['before']:.3f} {_ci(r['before_ci'])} | {r['after']:.3f} {_ci(r['after_ci'])} | "
                       f"{r['gain']:+.3f} | {oracle} | {r['episodes']} | {r['env_steps']:,} | {r['wall_s']:.0f} | "
                       f"{_yes(r)} |")
        out += [f"\nSeed {seed}: {r['note']}." for seed, r in _by_seed(sec) if r.get("note")]
    for key in prm_keys(results):
        sec = results[key]
        first = _by_seed(sec)[0][1]
        mode, weight = first.get("prm_mode", "potential"), first.get("prm_weight", 1.0)
        models = [r["prm_model"] for _, r in _by_seed(sec) if r.get("prm_model")]
        policy = max((m.get("policy_episodes", 0) for m in models), default=0)
        every = sec.get("conditions", {}).get("args", {}).get("eval_every", 25)
        data = f" The PRMs also learned from {policy} episodes of the seed's pre-trained policy." if policy else ""
        anneal = first.get("prm_anneal")
        fade = ""
        if anneal is not None:
            end = first.get("prm_anneal_end", 1.0)
            span, flag = (("over the run", "") if end == 1.0 else
                          (f"over the first {end:.0%} of the run's iterations and stayed there",
                           f" --reward.anneal_end {end:g}"))
            fade = (f" The prm weight moved linearly from {weight:g} to {anneal:g} {span} (`--reward.anneal "
                    f"'{{prm: {anneal:g}}}'{flag}`).")
        lr = first.get("lr_actor")
        step = (f" Both runs' PPO actor step is {lr:g} (`--algo.lr_actor`), not the preset's {preset_lr_actor():g}."
                if lr is not None else "")
        if first.get("ema"):
            step += (f" Both runs evaluate the moving average of their weights (`--eval.ema {first['ema']:g}`, about "
                     f"the last {1 / (1 - first['ema']):.0f} iterations), not the weights as trained.")
        if first.get("sampler"):
            step += f" {_explore(first['sampler'])}"
        if first.get("normalize_advantages") is False:
            step += (" Both runs use PPO's advantages as they come, without normalizing them over each rollout "
                     "(`--algo.normalize_advantages false`).")
        out += ["", f"### Process reward model{_variant(key)}", "",
                "`--parts prm`: two quickstart PPO runs from the same pre-trained start, `{success: 1.0}` and "
                f"`{{success: 1.0, prm: {weight:g}}}` (`--reward.prm.mode {mode}`), evaluated every {every} iterations "
                f"({first['mixed_curve'][1][0]:,} env steps) on 400 held-out episodes.{_start(sec)}{data}{fade}{step} "
                f"{_conditions(sec)}." + (f" {sec['note']}" if sec.get("note") else ""), "",
                "*Sparse improved*: the sparse run's final lies above the start's 95% interval (otherwise matching it "
                "says nothing about sample efficiency and the row cannot meet the target). *Met*: the sparse run "
                "improved, the ratio is <= 0.6, and the PRM run does not end below the sparse final's 95% interval. "
                "*3-eval ratio*: the same "
                "crossing read on trailing means of 3 evaluations (the sparse run's last three against the PRM run's "
                "at each step and the two before), less moved by one evaluation's noise; the target is read on single "
                "evaluations.", "",
                "| seed | start | sparse final | sparse improved | its env steps | PRM final | PRM steps to the sparse "
                "final | ratio | met | 3-eval ratio |", "|---:|---:|---:|---|---:|---:|---:|---:|---|---:|"]
        for seed, r in _by_seed(sec):
            reached = r["mixed_steps_to_sparse_final"]
            smooth = prm_crossing(r["sparse_curve"], r["mixed_curve"], window=3)[2]
            out.append(f"| {seed} | {r['start']:.3f} | {r['sparse_final']:.3f} | {'yes' if r['sparse_improved'] else 'no'} | "
                       f"{r['sparse_steps']:,} | {r['mixed_final']:.3f} | "
                       f"{'-' if reached is None else f'{reached:,}'} | {_ratio(r['step_ratio'])} | "
                       f"{'yes' if prm_ok(r) else 'no'} | {_ratio(smooth)} |")
        out += render_vs_preset(sec)
        out += ["", f"![held-out success of the sparse and the PRM run per seed](img/{plot_name(key)})"]
    out += render_prm_summary(results)
    for key in replicate_keys(results):
        out += render_replicate(key, results[key])
    for key in curriculum_keys(results):
        sec = results[key]
        rows = _by_seed(sec)
        first = rows[0][1]
        rl = all("rl_s" in a for _, r in rows for a in r["arms"].values())  # RL seconds over resumed segments
        out += ["", f"### Curriculum task selection{_variant(key)}", "",
                f"`--parts curriculum`: the quickstart's pipeline on `mujoco/multi` (12 tasks: 3 pick, 3 push, 6 "
                f"stack): {first['demos']} expert demos, {first['sft_steps']} steps of imitation, then from that one pre-trained start one "
                f"RL stage ({_curriculum_learner(first)}) per task "
                f"sampler for {first['iterations']} "
                "iterations (the same env steps), each scored by the per-task protocol "
                f"({first['episodes_per_task']} held-out episodes of every task; success = the mean over tasks, "
                f"pooled 95% Wilson interval). {_conditions(sec)}." + (f" {sec['note']}" if sec.get("note") else ""),
                "",
                "| seed | sampler | before [95% CI] | after [95% CI] | vs uniform | env steps | gradient steps | wall s |"
                + (" RL s, all segments |" if rl else ""), "|---:|---|---|---|---:|---:|---:|---:|" + ("---:|" if rl else "")]
        for seed, r in rows:
            base = r["arms"].get("uniform")
            for sampler, a in r["arms"].items():
                diff = f"{a['after'] - base['after']:+.3f}" if base is not None and sampler != "uniform" else "-"
                out.append(f"| {seed} | {sampler} | {a['before']:.3f} {_ci(a['before_ci'])} | {a['after']:.3f} "
                           f"{_ci(a['after_ci'])} | {diff} | {a['env_steps']:,} | {_or_dash(a.get('gradient_steps'))} | "
                           f"{a['wall_s']:.0f} |" + (f" {a['rl_s']:.0f} |" if rl else ""))
        samplers = list(first["arms"])
        if len(rows) > 1:  # pooled over seeds: equal episodes per task and seed, so the pooled rate is the mean
            out += ["", f"Pooled over seeds {', '.join(s for s, _ in rows)} (mean over tasks and seeds, 95% Wilson "
                    "interval of the pooled episodes; *seeds above uniform*: seeds whose mean is higher):", "",
                    "| sampler | after [95% CI] | vs uniform | seeds above uniform | episodes |", "|---|---|---:|---|---:|"]
            for sampler in samplers:
                arms = [r["arms"][sampler] for _, r in rows if sampler in r["arms"]]
                n = sum(a["episodes"] for a in arms)
                wins = round(sum(a["after"] * a["episodes"] for a in arms))
                lo, hi = wilson_interval(wins, n)
                bases = [r["arms"]["uniform"]["after"] for _, r in rows if sampler in r["arms"] and "uniform" in r["arms"]]
                mine = [a["after"] for a in arms]
                diff = f"{sum(mine) / len(mine) - sum(bases) / len(bases):+.3f}" if sampler != "uniform" and bases else "-"
                above = (f"{sum(m > b for m, b in zip(mine, bases))} of {len(bases)}"
                         if sampler != "uniform" and len(bases) == len(mine) else "-")
                out.append(f"| {sampler} | {wins / n:.3f} [{lo:.2f}-{hi:.2f}] | {diff} | {above} | {n} |")
        tasks = list(first["arms"][samplers[0]]["per_task_after"])
        out += ["", "Per task, mean over seeds of held-out success (before RL, then after each sampler's RL stage):", "",
                "| task | before | " + " | ".join(samplers) + " |", "|---|---:|" + "---:|" * len(samplers)]
        for t in tasks:
            before = sum(r["arms"][samplers[0]]["per_task_before"][t] for _, r in rows) / len(rows)
            cells = [sum(r["arms"][s]["per_task_after"][t] for _, r in rows) / len(rows) for s in samplers]
            out.append(f"| {t} | {before:.2f} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
        out += _reeval_tables(rows)
        if has_curves(sec):
            out += ["", f"![per-task training success and task weights, seed {rows[0][0]}]"
                    f"(img/{plot_name(key)})"]
    return "\n".join(out) + "\n"


def _reeval_tables(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """A curriculum section's ``--reeval`` tables (seeds whose every arm was re-evaluated): per seed and sampler,
    then pooled over seeds, each against uniform paired episode by episode; empty without re-evaluations."""
    from vla_rl.evaluation import paired_difference, wilson_interval

    rows = [(seed, r) for seed, r in rows if "uniform" in r["arms"] and all("reeval" in a for a in r["arms"].values())]
    if not rows:
        return []
    first = rows[0][1]["arms"]["uniform"]["reeval"]
    loads = [a["reeval"]["load_average_at_end"] for _, r in rows for a in r["arms"].values()
             if "load_average_at_end" in a["reeval"]]
    load = f", load average {min(loads):.1f}-{max(loads):.1f} at the ends" if loads else ""
    out = ["", f"Re-evaluated (`--reeval`, {first.get('date', '?')}{load}): "
           f"each run's final policy on {first['episodes_per_task']} held-out episodes of every task, seeded like the "
           "run's own evaluation, so episode k of a task starts from the same state for every sampler (episodes "
           "0-" + f"{rows[0][1]['episodes_per_task'] - 1} are the table's). *vs uniform, paired*: the mean of the "
           "per-episode differences from uniform's policy, with its 95% normal interval; an interval above 0 says this "
           "policy beats uniform's on these states beyond the evaluation's noise (training noise is what the seeds "
           "replicate).", "",
           "| seed | sampler | success [95% CI] | vs uniform, paired [95% CI] | episodes | wall s |",
           "|---:|---|---|---|---:|---:|"]

    def paired(base: list[dict[str, str]], other: list[dict[str, str]]) -> str:
        mean, lo, hi, _ = paired_difference(base, other)
        return f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]"

    for seed, r in rows:
        base = r["arms"]["uniform"]["reeval"]["outcomes"]
        for sampler, a in r["arms"].items():
            e = a["reeval"]
            diff = "-" if sampler == "uniform" else paired([base], [e["outcomes"]])
            out.append(f"| {seed} | {sampler} | {e['success']:.3f} {_ci(e['ci'])} | {diff} | {e['episodes']} | "
                       f"{e['wall_s']:.0f} |")
    if len(rows) > 1:
        out += ["", f"Pooled over seeds {', '.join(s for s, _ in rows)}:", "",
                "| sampler | success [95% CI] | vs uniform, paired [95% CI] | seeds above uniform | episodes |",
                "|---|---|---|---|---:|"]
        bases = [r["arms"]["uniform"]["reeval"] for _, r in rows]
        for sampler in rows[0][1]["arms"]:
            mine = [r["arms"][sampler]["reeval"] for _, r in rows]
            n = sum(e["episodes"] for e in mine)
            wins = sum(seq.count("1") for e in mine for seq in e["outcomes"].values())
            lo, hi = wilson_interval(wins, n)
            diff = "-" if sampler == "uniform" else paired([b["outcomes"] for b in bases], [e["outcomes"] for e in mine])
            above = "-" if sampler == "uniform" else \
                f"{sum(e['success'] > b['success'] for e, b in zip(mine, bases))} of {len(rows)}"
            out.append(f"| {sampler} | {wins / n:.3f} [{lo:.2f}-{hi:.2f}] | {diff} | {above} | {n} |")
    return out


def main() -> None:
    from rewards.learned.terms import PRM_MODES

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", nargs="+", default=["classifier"],
                   choices=["classifier", "ppo-classifier", "bc-classifier", "prm", "prm-replicate", "curriculum"],
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
                   help="prm: evaluate every this many iterations (20 of 200: an evaluation falls on 60%% of the sparse "
                        "run's env steps, the target's line; 25, the default before session 42, put the last one "
                        "at or under the line at 50%%)")
    p.add_argument("--prm_weight", type=float, default=1.0)
    p.add_argument("--prm_anneal", type=float, default=None,
                   help="prm: the weight the prm term reaches at the run's last iteration, linearly from --prm_weight "
                        "(reward.anneal; names the mixed run -a<weight>)")
    p.add_argument("--prm_anneal_end", type=float, default=1.0,
                   help="prm: the fraction of the run's iterations by which --prm_anneal's weight is reached, and kept "
                        "from then on (reward.anneal_end; other than 1 names the mixed run -e<fraction>)")
    p.add_argument("--lr_actor", type=float, default=None,
                   help="prm: both runs' PPO actor step (default: the quickstart_ppo preset's); names their folders, "
                        "and the PRM run is also read against the preset's sparse runs under --out")
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
                        "sparse run is shared by every name, the mixed run is prm-mixed-<name>[-<mode>][-w<weight>][-a<anneal>]-s<seed>")
    p.add_argument("--prm_mode", default="potential", choices=PRM_MODES,
                   help="prm: the term's form (reward.prm.mode): progress gained per chunk, or progress above the "
                        "episode's best so far (VLA-RL's milestones)")
    p.add_argument("--eval_episodes", type=int, default=400, help="held-out episodes per RL evaluation")
    p.add_argument("--samplers", nargs="+", default=["uniform", "curriculum"],
                   help="curriculum: the task samplers compared (uniform first: the baseline)")
    p.add_argument("--per_task", type=int, default=34, help="curriculum: held-out episodes per task (12 tasks)")
    p.add_argument("--curriculum_iterations", type=int, default=120, help="curriculum: RL iterations per sampler")
    p.add_argument("--curriculum_demos", type=int, default=200, help="curriculum: expert demos for pre-training")
    p.add_argument("--curriculum_sft_steps", type=int, default=2000, help="curriculum: pre-training steps")
    p.add_argument("--curriculum_preset", default="",
                   help="curriculum: the quickstart preset of the RL stage (empty: filtered_bc; quickstart_ppo: "
                        "Flow-SDE PPO); the pre-trained start is the sft_policy already in the first sampler's run "
                        "folder under --out (copy one there to share another section's start), else that preset's")
    p.add_argument("--curriculum_min_buffer", type=int, default=64,
                   help="curriculum: filtered_bc's min_buffer (the quickstart's 256 took a 0.03 start 120 "
                        "iterations without one update)")
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
    p.add_argument("--tag", default="",
                   help="file this run's rows under '<part> (TAG)' in rewards.json (a variant of a part's settings), "
                        "not the part's own section")
    p.add_argument("--out", default="runs/bench-rewards", help="models and runs go here")
    p.add_argument("--reeval", default="", metavar="SECTION",
                   help="run nothing new: re-evaluate the final policies of the curriculum section SECTION of "
                        "rewards.json (its run folders under --out) on --reeval_per_task episodes of every task, "
                        "keeping each episode's outcome so the samplers pair up episode by episode; then stop")
    p.add_argument("--reeval_per_task", type=int, default=100, help="--reeval: held-out episodes per task")
    p.add_argument("--render", type=Path, default=None,
                   help="write the tables of every part in rewards.json into this file's learned-rewards section "
                        "(docs/benchmarks.md) and each curriculum section's plot into docs/img/curriculum*.png, then "
                        "stop")
    args = p.parse_args()
    if args.render is not None:
        results = json.loads(RESULTS.read_text())
        for key in curriculum_keys(results):
            if has_curves(results[key]):
                plot_curriculum(results[key], ROOT / "docs" / "img" / plot_name(key))
        for key in prm_keys(results):
            plot_prm(results[key], ROOT / "docs" / "img" / plot_name(key))
        for key in replicate_keys(results):
            plot_prm(results[key], ROOT / "docs" / "img" / plot_name(key), REPLICATE_CURVES)
        write_section(args.render, "## Learned rewards (issue 19)", render(results))
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    out = Path(args.out)
    start = Start(args.env, args.demos, args.sft_steps, args.start_success, args.check_every)
    if args.reeval:
        reevaluate(args.reeval, out, args.seeds, args.reeval_per_task)
        return
    for part in args.parts:
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
            elif part == "curriculum":
                row = part_curriculum(seed, out, args.curriculum_iterations, args.per_task, args.curriculum_demos,
                                      args.curriculum_sft_steps, args.samplers, args.curriculum_min_buffer,
                                      args.curriculum_preset)
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
            results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}  # other parts may run alongside
            key = part if args.classifier == "classifier" or part not in CLASSIFIER_PARTS else f"{part} ({args.classifier})"
            key = f"{part} ({args.tag})" if args.tag else key
            section = results.setdefault(key, {"seeds": {}})
            section["seeds"][str(seed)] = row
            section["conditions"] = {
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "torch": torch.__version__,
                "load_average_at_end": os.getloadavg()[0], "omp_threads": os.environ.get("OMP_NUM_THREADS"),
                "date": time.strftime("%Y-%m-%d"), "args": vars(args),
            }
            write_json(RESULTS, results)
            print(json.dumps({part: row}, default=str)[:600], flush=True)


def sampler_fields(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--noise_level`` / ``--explore_noise`` as the sampler fields they set (None: neither given)."""
    fields = {k: v for k, v in (("noise_level", args.noise_level), ("explore_noise", args.explore_noise))
              if v is not None}
    return fields or None


if __name__ == "__main__":
    main()
