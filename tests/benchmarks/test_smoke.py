"""Smoke tests of the benchmark scripts (``benchmarks/*.py``), run as a user runs them, in child processes.

Every script must start and print its usage (its imports and argument parser hold: all scripts' ``--help`` run in
one child process, so torch and the project are imported once); the scripts that read finished
runs are run on tiny hand-made run folders, publishing into a temporary results folder and page, so the harness's
contract holds end to end: ``NAME.json`` with the command, commit, machine and date, and one block of the page per
benchmark, replaced (never appended) by a re-run. The measurements themselves take minutes to hours and are not run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "harness")


def bench(name: str, *args: str | Path, timeout: int = 120) -> subprocess.CompletedProcess:
    """``python benchmarks/NAME.py ARGS`` from the repository root; fails the test, with its output, on an error."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, f"benchmarks/{name}.py", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"benchmarks/{name}.py {args} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done


def test_every_script_is_smoke_tested() -> None:
    assert {"quickstart", "learned_rewards", "grape", "rac", "faults"} <= set(SCRIPTS)
    assert "harness" not in SCRIPTS


HELP_ALL = """
import contextlib, io, json, runpy, sys, traceback
sys.path.insert(0, "benchmarks")  # as when a script runs: its folder first (harness, sibling scripts)
out = {}
for name in sys.argv[1:]:
    sys.argv, buf = [f"benchmarks/{name}.py", "--help"], io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            runpy.run_path(f"benchmarks/{name}.py", run_name="__main__")
        out[name] = {"exit": "returned without printing its usage", "stdout": buf.getvalue()}
    except SystemExit as exc:
        out[name] = {"exit": exc.code, "stdout": buf.getvalue()}
    except BaseException:
        out[name] = {"exit": traceback.format_exc(), "stdout": buf.getvalue()}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def helps() -> dict[str, dict]:
    """Every script's ``--help``: ``{name: {exit, stdout}}``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", HELP_ALL, *SCRIPTS], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", SCRIPTS)
def test_help(helps: dict[str, dict], name: str) -> None:
    """Each script imports and parses its arguments (``--help``), and offers the harness's output options."""
    got = helps[name]
    assert got["exit"] in (0, None), got["exit"]
    assert got["stdout"].startswith("usage:") and "--results-dir" in got["stdout"] and "--page" in got["stdout"]


def _pretrained_run(folder: Path, seed: int, success: float) -> Path:
    """A finished ``vla-rl quickstart --iterations 0`` run folder, as far as its ``report.json`` goes."""
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps({
        "seed": seed, "demos": 50, "sft_steps": 2000, "success_before": success,
        "success_before_ci": [success - 0.05, success + 0.05], "episodes_per_eval": 400,
        "stages": {"pretrain": 321.0}, "wall_seconds": 400.0}))
    return folder


def test_a_rerun_replaces_its_results_file_and_its_block_of_the_page(tmp_path: Path) -> None:
    results, page = tmp_path / "results", tmp_path / "results.md"
    page.write_text("# Results\n\nkept above\n\n<!-- results:other -->\nother table\n<!-- /results:other -->\n")
    run = _pretrained_run(tmp_path / "runs" / "wide", 0, 0.5)
    out = ["--results-dir", results, "--page", page]
    bench("pretrain_variants", "--run", f"wide={run}", *out)
    first = page.read_text()
    assert first.count("<!-- results:pretrain_variants -->") == 1 and "| wide | 0 | 50 | 2000 | 0.500" in first
    record = json.loads((results / "pretrain_variants.json").read_text())
    assert record["benchmark"] == "pretrain_variants" and record["rows"][0]["success"] == 0.5
    assert record["command"].startswith("python benchmarks/pretrain_variants.py --run wide=")
    assert record["commit"] and record["machine"] and record["date"]

    (run / "report.json").write_text((run / "report.json").read_text().replace('"success_before": 0.5',
                                                                                 '"success_before": 0.625'))
    bench("pretrain_variants", "--run", f"wide={run}", *out)
    second = page.read_text()
    assert second.count("<!-- results:pretrain_variants -->") == 1 and second.count("| wide |") == 1
    assert "0.625" in second and "| wide | 0 | 50 | 2000 | 0.500" not in second
    assert second.startswith("# Results\n\nkept above\n") and "other table" in second  # the rest is untouched
    assert json.loads((results / "pretrain_variants.json").read_text())["rows"][0]["success"] == 0.625


def test_rl_recipes_reads_finished_runs(tmp_path: Path) -> None:
    run = tmp_path / "fbc-s1"
    run.mkdir()
    rows = [{"step": 0, "eval/success": 0.4, "eval/success_ci_low": 0.35, "eval/success_ci_high": 0.45}]
    rows += [{"step": 768 * i, "rollout/success": 0.3 + i / 100, "update/approx_kl": 0.01} for i in range(1, 4)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "report.json").write_text(json.dumps({"seed": 1, "algorithm": "filtered_bc", "wall_seconds": 60.0}))
    for side, rate in (("before", 0.4), ("after", 0.55)):
        (run / f"eval_{side}.json").write_text(json.dumps({"success_rate": rate, "ci_low": rate - 0.05,
                                                            "ci_high": rate + 0.05, "episodes": 400}))
    bench("rl_recipes", "--run", f"filtered_bc={run}", "--results-dir", tmp_path, "--page", tmp_path / "r.md")
    text = (tmp_path / "r.md").read_text()
    assert "| filtered_bc | 1 | 0.400 | 0.550 [0.50-0.60] | +0.150 | 3 |" in text


@pytest.mark.slow
def test_policy_latency_measures_the_compact_policy(tmp_path: Path) -> None:
    bench("policy_latency", "--only", "compact-flow", "--batch", "2", "--repeats", "1", "--results-dir", tmp_path,
          "--page", tmp_path / "r.md", timeout=600)
    rows = json.loads((tmp_path / "policy_latency.json").read_text())["rows"]
    assert rows and all(r["name"].startswith("compact-flow") for r in rows)


def test_a_page_with_a_broken_block_is_refused_by_name(tmp_path: Path) -> None:
    page = tmp_path / "results.md"
    page.write_text("<!-- results:pretrain_variants -->\nan unfinished block\n")
    run = _pretrained_run(tmp_path / "runs" / "wide", 0, 0.5)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "benchmarks/pretrain_variants.py", "--run", f"wide={run}", "--results-dir",
                           str(tmp_path), "--page", str(page)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and f"{page}: expected one <!-- results:pretrain_variants --> before one" in done.stderr
    assert page.read_text() == "<!-- results:pretrain_variants -->\nan unfinished block\n"  # left as it was
    assert not (tmp_path / "pretrain_variants.json").exists()  # and nothing published


def test_faults_injects_and_recovers_checkpoint_faults(tmp_path: Path) -> None:
    """One fault of each checkpoint kind through the fault suite's injector (:mod:`vla_rl.faults`)."""
    bench("faults", "--n", "1", "--kinds", "checkpoint", "--results-dir", tmp_path, "--page", tmp_path / "r.md",
          timeout=300)
    kinds = json.loads((tmp_path / "faults.json").read_text())["rows"]
    assert set(kinds) == {"checkpoint_kill", "checkpoint_disk_full", "checkpoint_damage"}
    assert all(k["failures"] == 0 and k["files_lost"] == 0 and k["resumed"] == 1 for k in kinds.values())


FIRST_PARTY = ("vla_core", "sim", "policies", "rewards", "hardware", "vla_rl")


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_project_name_a_script_imports_exists(name: str) -> None:
    """The scripts import much of the project inside their functions (what ``--help`` does not reach): every
    ``from <project module> import <name>`` of a script, lazy ones included, still resolves."""
    import ast
    import importlib

    tree = ast.parse((ROOT / "benchmarks" / f"{name}.py").read_text())
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in FIRST_PARTY:
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    try:
                        importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        missing.append(f"{node.module}.{alias.name} (line {node.lineno})")
    assert not missing, f"benchmarks/{name}.py imports names the project no longer has: {missing}"
