"""GRAPE alignment (``vla-rl align``) from the quickstart's pre-trained policy, per objective, next to PPO.

    OMP_NUM_THREADS=1 python benchmarks/grape.py [--seeds 0 1 2] [--episodes 400] \\
        [--objectives task safety efficiency] [--pretrained DIR_WITH_{seed}] [--ppo true] [-- ALIGN ARGS]

Every command runs in its own process, in run folders under ``--runs``:

1. per seed, the quickstart's pre-trained policy recipe on ``mujoco/pick-any`` (``vla-rl quickstart
   --iterations 0``: its demos and few-shot flow-matching pre-training, no RL), or the policy folder
   ``--pretrained`` names for that seed (e.g. the ``sft_policy`` of a ``vla-rl quickstart --seed N`` run);
2. objective by objective, every seed: ``vla-rl align --preset align_<objective> --policy.path <that policy>``,
   evaluated before and after on ``--episodes`` held-out episodes (95% Wilson intervals);
3. with ``--ppo true``, after each seed's ``task`` run, PPO from the same policy with the quickstart's settings
   for as many env steps as that alignment took (``vla-rl quickstart --preset quickstart_ppo --resume true
   --iterations K`` in a folder holding a copy of the policy), its final policy then also evaluated on the task
   alignment's held-out episodes (the quickstart's own evaluation plays others).

Align arguments after ``--`` go to every ``vla-rl align`` run, ``{seed}`` replaced by the run's seed. With
``--tpo.demo_bc W`` and no ``--tpo.demos``, each run imitates its own seed's pre-training demos (the quickstart's demo
cache for that seed).

Targets: ``task``: success after >= before + 0.15 per seed; ``safety``: collision rate down by >=
40% relative with success not below the before interval; ``efficiency``: mean steps of successful episodes
down by >= 10% with success not below the before interval (the efficiency row also shows those steps on the
states solved before and after, a diagnostic). Published by ``benchmarks/harness.py`` after every run, so what is
done survives a kill.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness
import torch

ROOT = harness.ROOT
PPO_STEPS_PER_ITER = 32 * 6 * 4  # the quickstart's PPO: 32 envs x 6 decisions x 4-step chunks
OBJECTIVES = ("task", "safety", "efficiency")  # the presets configs/align_<objective>.yaml, in table order


def _load_average() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def _run(cmd: list[str], check: bool = True) -> float:
    print("$", " ".join(cmd), flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env)
    if check and proc.returncode != 0:
        raise RuntimeError(f"exit code {proc.returncode}: {' '.join(cmd)}")
    return time.perf_counter() - t


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "vla_rl.cli", *args]


def pretrain(seed: int, base: Path, extra: list[str], template: str = "") -> tuple[Path, float]:
    """The quickstart's pre-trained policy for ``seed`` (no RL); returns its folder and the wall seconds.

    ``template``: an existing pre-trained policy folder per seed (``{seed}`` is replaced), for example the
    ``sft_policy`` of ``vla-rl quickstart --seed N`` runs: used as it is, nothing is trained (0 seconds).
    """
    if template:
        policy = Path(template.format(seed=seed))
        if not (policy / "config.json").exists():
            raise FileNotFoundError(f"--pretrained: no policy at {policy} (its config.json is missing)")
        return policy, 0.0
    run_dir = base / "pretrain"
    wall = 0.0
    policy = run_dir / "sft_policy"
    if not (policy / "config.json").exists():
        # 0 iterations: demos and pre-training, one evaluation episode (only the policy counts here)
        wall = _run(_cli("quickstart", "--seed", str(seed), "--iterations", "0", "--eval_episodes", "1",
                         "--run_dir", str(run_dir), "--demo_cache", str(base / "demos"), "--logging.wandb", "false",
                         *(["--resume", "true"] if run_dir.exists() else []), *extra))
        if not (policy / "config.json").exists():
            raise RuntimeError(f"the quickstart wrote no pre-trained policy at {policy}")
    return policy, wall


def with_demos(seed: int, base: Path, pretrained: str, extra: list[str], policy: Path | None = None) -> list[str]:
    """``extra`` plus ``--tpo.demos <the seed's pre-training demos>`` when it asks for ``--tpo.demo_bc`` without
    naming demos and the ``policy`` folder records none (``vla-rl align`` reads its ``sft.json`` itself): the
    quickstart's demo cache for ``seed`` (its default one for
    a ``--pretrained`` policy, this benchmark's own when it pre-trained). ``{seed}`` in any argument is replaced.

    Raises:
        FileNotFoundError: when those demos are not there.
    """
    extra = [a.replace("{seed}", str(seed)) for a in extra]
    if "--tpo.demo_bc" not in extra or "--tpo.demos" in extra:
        return extra
    from vla_rl.commands.quickstart import QuickstartConfig, _demo_root
    from vla_rl.algorithms.sft import pretraining_dataset

    if policy is not None and pretraining_dataset(policy):
        return extra

    demos = _demo_root(QuickstartConfig(seed=seed, demo_cache="" if pretrained else str(base / "demos")))
    if not (demos / "meta" / "info.json").exists():
        raise FileNotFoundError(f"--tpo.demo_bc: no quickstart demos for seed {seed} at {demos}; name them with "
                                "--tpo.demos (a '{seed}' in it is replaced)")
    return [*extra, "--tpo.demos", str(demos)]


def align(seed: int, objective: str, policy: Path, base: Path, episodes: int, extra: list[str]) -> dict[str, Any]:
    """One ``vla-rl align`` run; its report plus the measured wall seconds."""
    run_dir = base / f"align-{objective}"
    resume = ["--resume", "true"] if run_dir.exists() else []
    wall = _run(_cli("align", "--preset", f"align_{objective}", "--policy.path", str(policy), "--seed", str(seed),
                     "--eval_episodes", str(episodes), "--run_dir", str(run_dir), "--logging.wandb", "false",
                     *resume, *extra))
    return {**json.loads((run_dir / "report.json").read_text()), "wall": wall}


def ppo(seed: int, policy: Path, base: Path, env_steps: int, episodes: int, extra: list[str]) -> dict[str, Any]:
    """The quickstart's PPO from the pre-trained ``policy`` folder for about ``env_steps`` env steps."""
    run_dir = base / "ppo"
    if not (run_dir / "sft_policy").exists():
        shutil.copytree(policy, run_dir / "sft_policy")
    iters = max(1, math.ceil(env_steps / PPO_STEPS_PER_ITER))
    wall = _run(_cli("quickstart", "--preset", "quickstart_ppo", "--seed", str(seed), "--iterations", str(iters),
                     "--eval_episodes", str(episodes),
                     "--run_dir", str(run_dir), "--demo_cache", str(base / "demos"), "--resume", "true",
                     "--logging.wandb", "false", *extra))
    rep = json.loads((run_dir / "report.json").read_text())
    final = last_checkpoint(run_dir) / "policy"
    return {"success_before": rep["success_before"], "success_after": rep["success_after"],
            "success_before_ci": rep["success_before_ci"], "success_after_ci": rep["success_after_ci"],
            "env_steps": rep["env_steps"], "iterations": iters, "wall": wall,
            "after_on_task_episodes": on_task_episodes(base, final, episodes)}


def last_checkpoint(run_dir: Path) -> Path:
    """The newest checkpoint of the run ``run_dir`` (alignment or quickstart) that verifies."""
    from vla_rl.checkpoint import latest_checkpoint

    last = latest_checkpoint(run_dir / "checkpoints")
    if last is None:
        raise FileNotFoundError(f"{run_dir / 'checkpoints'}: no checkpoint that verifies")
    return last


def evaluate_as_run(checkpoint: Path, policy: Path, episodes: int) -> dict[str, Any]:
    """``policy`` on ``episodes`` held-out episodes of an alignment run, with the config of its ``checkpoint``
    folder (env, seeds, costs): :func:`vla_rl.grape.rounds.evaluate_policy_folder`."""
    from vla_rl.cli import parse_config
    from vla_rl.grape.rounds import AlignConfig, evaluate_policy_folder

    config = checkpoint / "config.json"
    return evaluate_policy_folder(parse_config(AlignConfig, ["--config_path", str(config), "--policy.path",
                                                             str(policy)]), episodes)


def on_task_episodes(base: Path, policy: Path, episodes: int) -> dict[str, Any]:
    """``policy`` on the held-out episodes of ``base``'s task alignment, so PPO's result compares with the task
    row's before / after episode for episode; the quickstart's own evaluation plays other episodes."""
    ev = evaluate_as_run(last_checkpoint(base / "align-task"), policy, episodes)
    return {"success": ev["success"], "success_ci": ev["success_ci"], "episodes": ev["episodes"], "policy": str(policy)}


def success_kept(after: float, before_ci: list[float]) -> bool:
    """The safety and efficiency targets' second half: success after not below the start's 95% interval."""
    return after >= before_ci[0]


def targets(objective: str, r: dict[str, Any]) -> tuple[bool, str]:
    """Whether the run meets the target for ``objective``, and the measured quantity."""
    from vla_rl.grape.report import collisions_by_outcome, shared_success_steps

    b, a = r["before"], r["after"]
    kept = success_kept(a["success"], b["success_ci"])
    if objective == "task":
        gain = a["success"] - b["success"]
        return gain >= 0.15 - 1e-9, f"success {gain:+.3f}"
    if objective == "safety":
        rb, ra = b.get("collision_rate", 0.0), a.get("collision_rate", 0.0)
        rel = (ra - rb) / rb if rb > 0 else float("nan")
        what = f"collision rate {rb:.3f} -> {ra:.3f} ({rel:+.0%})"
        cb, ca = collisions_by_outcome(b), collisions_by_outcome(a)
        if cb and ca:  # a diagnostic: which outcome the colliding episodes are
            what += "; colliding " + ", ".join(f"{k} {cb[k][0]}/{cb[k][1]} -> {ca[k][0]}/{ca[k][1]}" for k in cb)
        return (rb > 0 and rel <= -0.40 and kept), what
    sb, sa = b["mean_steps_success"], a["mean_steps_success"]
    if not sb or not sa:
        return False, "no successful episodes to measure steps on"
    rel = (sa - sb) / sb
    what = f"steps of successes {sb:.1f} -> {sa:.1f} ({rel:+.0%})"
    states, pb, pa = shared_success_steps(b, a)
    if states:  # a diagnostic beside the target's measure, which the verdict keeps
        what += f"; on the {states} states solved before and after {pb:.1f} -> {pa:.1f} ({(pa - pb) / pb:+.0%})"
    return (rel <= -0.10 and kept), what


def row(seed: int, objective: str, r: dict[str, Any]) -> dict[str, Any]:
    ok, what = targets(objective, r)
    b, a = r["before"], r["after"]
    return {"seed": seed, "objective": objective, "success_before": b["success"], "success_before_ci": b["success_ci"],
            "success_after": a["success"], "success_after_ci": a["success_ci"], "episodes": a["episodes"],
            "costs_before": b["costs"], "costs_after": a["costs"],
            "collision_rate_before": b.get("collision_rate"), "collision_rate_after": a.get("collision_rate"),
            "mean_steps_success_before": b["mean_steps_success"], "mean_steps_success_after": a["mean_steps_success"],
            "env_steps": r["env_steps"], "rounds": r["rounds"], "wall_seconds": r["wall"], "target_met": ok,
            "measured": what}


def verdict(r: dict[str, Any]) -> str:
    """A row's target column: met / not met, and for safety and efficiency which half failed when success fell
    below its start's interval (their measured quantity alone can look met then)."""
    if r["target_met"]:
        return "met"
    if r["objective"] != "task" and not success_kept(r["success_after"], r["success_before_ci"]):
        return "not met: success below its start's interval"
    return "not met"


def table(rows: list[dict[str, Any]], ppo_rows: dict[int, dict[str, Any]]) -> str:
    ci = lambda x: f"{x[0]:.2f}-{x[1]:.2f}"  # noqa: E731
    lines = ["| seed | objective | success before [95% CI] | success after [95% CI] | collision rate | "
             "steps of successes | env steps | wall s | target | measured |", "|---:|---|---|---|---|---|---:|---:|---|---|"]
    for r in rows:
        cr = (f"{r['collision_rate_before']:.3f} -> {r['collision_rate_after']:.3f}"
              if r["collision_rate_before"] is not None else "-")
        st = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        lines.append(f"| {r['seed']} | {r['objective']} | {r['success_before']:.2f} [{ci(r['success_before_ci'])}] | "
                     f"{r['success_after']:.2f} [{ci(r['success_after_ci'])}] | {cr} | "
                     f"{st(r['mean_steps_success_before'])} -> {st(r['mean_steps_success_after'])} | {r['env_steps']} | "
                     f"{r['wall_seconds']:.0f} | {verdict(r)} | {r['measured']} |")

    def on_task(p: dict[str, Any]) -> str:
        a = p.get("after_on_task_episodes")
        return f"; after on the task row's held-out episodes {a['success']:.2f} [{ci(a['success_ci'])}]" if a else ""

    for seed, p in ppo_rows.items():
        lines.append(f"| {seed} | PPO (same env steps as task) | {p['success_before']:.2f} [{ci(p['success_before_ci'])}] | "
                     f"{p['success_after']:.2f} [{ci(p['success_after_ci'])}] | - | - | {p['env_steps']} | "
                     f"{p['wall']:.0f} | - | {p['iterations']} PPO iterations{on_task(p)} |")
    return "\n".join(lines)


def main() -> None:
    argv, extra = harness.split_passthrough(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=400, help="held-out episodes per evaluation")
    parser.add_argument("--objectives", nargs="+", choices=OBJECTIVES, default=list(OBJECTIVES))
    parser.add_argument("--ppo", type=lambda s: s.lower() == "true", default=True,
                        help="also run PPO for the env steps of the task alignment (true/false)")
    parser.add_argument("--pretrain-args", default="", help="extra vla-rl quickstart arguments, one string")
    parser.add_argument("--pretrained", default="", help="existing pre-trained policy folder per seed, '{seed}' "
                        "replaced (e.g. runs/quickstart-mujoco-pick-any-s{seed}/sft_policy); default: pre-train")
    parser.add_argument("--runs", type=Path, default=None, help="parent folder of the run folders (default: new)")
    args = harness.add_output_args(parser).parse_args(argv)
    torch.set_num_threads(1)
    runs = args.runs or ROOT / "runs" / f"bench-grape-{time.strftime('%Y%m%d-%H%M%S')}"
    pre_extra = args.pretrain_args.split()
    rows, ppo_rows, pre_walls = [], {}, {}
    policies = {}
    for seed in args.seeds:
        policies[seed], pre_walls[seed] = pretrain(seed, runs / f"seed{seed}", pre_extra, args.pretrained)
    # objective by objective, so that a run cut short has every seed of the first objectives
    for objective in args.objectives:
        for seed in args.seeds:
            base = runs / f"seed{seed}"
            seed_extra = with_demos(seed, base, args.pretrained, extra, policies[seed])
            rows.append(row(seed, objective, align(seed, objective, policies[seed], base, args.episodes, seed_extra)))
            rows[-1].update(align_args=seed_extra, pretrained=str(policies[seed]),
                            load_average=round(_load_average(), 1))
            print(json.dumps(rows[-1], default=str), flush=True)
            publish(args, rows, ppo_rows, pre_walls, extra, pre_extra)  # what is done so far survives a kill
            if objective == "task" and args.ppo:
                ppo_rows[seed] = ppo(seed, policies[seed], base, rows[-1]["env_steps"], args.episodes, pre_extra)
                publish(args, rows, ppo_rows, pre_walls, extra, pre_extra)


def publish(args: argparse.Namespace, rows: list[dict[str, Any]], ppo_rows: dict[int, dict[str, Any]],
            pre_walls: dict[int, float], extra: list[str], pre_extra: list[str]) -> None:
    """Publish the runs finished so far (``benchmarks/harness.py``)."""
    plus = f", plus {' '.join(extra)}" if extra else ""
    met = sum(r["target_met"] for r in rows)
    body = "\n".join([
        f"`vla-rl align` (presets `align_<objective>`{plus}) from the quickstart's pre-trained policy on "
        "`mujoco/pick-any` (`vla-rl quickstart --iterations 0`), per seed and objective, evaluated on "
        f"{args.episodes} held-out episodes before and after (deterministic policy, 95% Wilson CI), and PPO with the "
        "quickstart's settings for the env steps of the task alignment. Wall times are of each command alone in its "
        f"process on a shared machine (load average {_load_average():.1f} at the end).",
        "", table(rows, ppo_rows), "",
        f"Targets met: {met} of {len(rows)} runs.",
    ])
    print("\n" + body)
    harness.publish("grape", args, body, rows=rows,
                    summary={"ppo": ppo_rows, "align_args": extra, "pretrain_args": pre_extra,
                             "pretrain_wall_seconds": pre_walls, "episodes": args.episodes})


if __name__ == "__main__":
    main()
