"""Score finished quickstart runs again under the current evaluation code, without training again.

    OMP_NUM_THREADS=1 python benchmarks/quickstart_rescore.py RUN_DIR [RUN_DIR ...] [--write docs/benchmarks.md]

For each run folder of ``vla-rl quickstart`` (default settings, any seed), the pre-trained policy
(``sft_policy``) and the policy after the last RL iteration are evaluated exactly as the quickstart's own
before / after evaluations are (same env settings, the run's held-out evaluation seeds, 400 episodes by
default, deterministic actions on the seeded noise stream of :func:`vla_rl.evaluation.evaluate_policy`).
Use it when the evaluation protocol changes but training does not (checked separately: the weights of a
run are bitwise the same), to put the recorded numbers on the new protocol. The numbers go to
``benchmarks/results/quickstart_rescore.json`` and, with ``--write``, to the section ``## Quickstart
rescored`` of a markdown file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_report import write_json, write_section  # noqa: E402

from policies.loading import load_policy  # noqa: E402
from vla_rl.cli import parse_config  # noqa: E402
from vla_rl.commands.quickstart import QuickstartConfig  # noqa: E402
from vla_rl.evaluation import evaluate_policy  # noqa: E402
from vla_rl.train_config import EVAL_SEED_BASE, SEED_BLOCK  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "quickstart_rescore.json"
SECTION = "## Quickstart rescored"


def rescore(run_dir: Path, eval_noise: str = "") -> dict:
    """Evaluate ``run_dir``'s pre-trained and final policies; the run's recorded numbers beside the new ones."""
    report = json.loads((run_dir / "report.json").read_text())
    seed = int(report["seed"])
    cfg = parse_config(QuickstartConfig, ["--seed", str(seed)])
    eval_seed = EVAL_SEED_BASE + seed * SEED_BLOCK
    final = run_dir / "checkpoints" / f"iter_{cfg.iterations:06d}" / "policy"
    out: dict = {"seed": seed, "run_dir": str(run_dir), "episodes": cfg.eval_episodes, "eval_noise": eval_noise or "saved",
                 "recorded_before": report["success_before"], "recorded_after": report["success_after"]}
    with cfg.env.make(seed=eval_seed) as env:
        for tag, path in (("before", run_dir / "sft_policy"), ("after", final)):
            policy = load_policy(path)
            if eval_noise:  # score the same weights with another initial noise of the ODE policy
                policy.configure_sampler(dataclasses.replace(policy.sampler, eval_noise=eval_noise))
            policy.eval()
            t = time.perf_counter()
            res = evaluate_policy(env, policy, cfg.eval_episodes, eval_seed, desc=f"seed {seed} {tag}")
            out[tag] = res.success_rate
            out[f"{tag}_ci"] = [res.ci_low, res.ci_high]
            out[f"{tag}_successes"] = res.successes
            out[f"{tag}_mean_length"] = res.mean_length
            out[f"{tag}_eval_seconds"] = time.perf_counter() - t
            print(f"seed {seed} {tag}: {res.successes}/{res.episodes} = {res.success_rate:.3f} "
                  f"(95% CI {res.ci_low:.2f}-{res.ci_high:.2f}; recorded {report[f'success_{tag}']:.3f})", flush=True)
    out["gain"] = out["after"] - out["before"]
    return out


def table(rows: list[dict]) -> str:
    lines = ["| seed | before (recorded) | before (now) | after (recorded) | after (now) | gain (now) | 95% CI after |",
             "|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['seed']} | {r['recorded_before']:.3f} | {r['before']:.3f} | {r['recorded_after']:.3f} | "
                     f"{r['after']:.3f} | {r['gain']:+.3f} | {r['after_ci'][0]:.2f}-{r['after_ci'][1]:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="quickstart run folders")
    parser.add_argument("--write", type=Path, default=None, help="markdown file whose section to replace")
    parser.add_argument("--eval-noise", default="", choices=["", "random", "zero"],
                        help="evaluate with this policy.sampler.eval_noise instead of the saved one")
    parser.add_argument("--results", type=Path, default=RESULTS, help="results JSON to write")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [rescore(r, args.eval_noise) for r in args.runs]
    write_json(args.results, {"rows": rows}, indent=2)
    print(table(rows))
    if args.write:
        write_section(args.write, SECTION, table(rows))


if __name__ == "__main__":
    main()
