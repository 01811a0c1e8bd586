"""The published GRAPE table (``docs/benchmarks.md``) is what ``benchmarks/grape.py --render`` makes of
``benchmarks/results/grape.json``, so the numbers in the docs can be traced to the results file."""

import json

import pytest

from tests.benchmarks import ROOT as _ROOT
from tests.benchmarks import docs_section, load_benchmark

grape = load_benchmark("grape")


def test_docs_table_is_rendered_from_the_results_file():
    result = json.loads((_ROOT / "benchmarks" / "results" / "grape.json").read_text())
    docs = docs_section(grape.SECTION)
    assert docs == grape.section(result).strip("\n")
    seeds = {r["seed"] for r in result["runs"]}
    assert {0, 1, 2} <= seeds and all(f"| {s} | task" in docs for s in seeds)


def test_render_rewrites_only_the_grape_section(tmp_path, monkeypatch):
    result = json.loads((_ROOT / "benchmarks" / "results" / "grape.json").read_text())
    result["runs"] = [r for r in result["runs"] if r["seed"] == 0]
    results = tmp_path / "grape.json"
    results.write_text(json.dumps(result))
    md = tmp_path / "b.md"
    md.write_text("# B\n\n## GRAPE alignment\n\nstale\n\n## Next\n\nkept\n")
    monkeypatch.setattr("sys.argv", ["grape.py", "--render", "--results", str(results), "--write", str(md)])
    grape.main()
    text = md.read_text()
    assert "stale" not in text and text.endswith("## Next\n\nkept\n")
    assert docs_section(grape.SECTION, text) == grape.section(result).strip("\n")
    assert "| 0 | task |" in text and "| 1 | task |" not in text


def test_demo_bc_runs_get_their_seeds_pretraining_demos(tmp_path, monkeypatch):
    """``--tpo.demo_bc`` without ``--tpo.demos`` imitates the seed's own quickstart demos: none added for a policy whose
    ``sft.json`` names them (align reads it), else this benchmark's cache when it pre-trained or the quickstart's
    default one for ``--pretrained``; ``{seed}`` is replaced; missing demos are named."""
    monkeypatch.setenv("VLA_RL_HOME", str(tmp_path / "home"))
    base = tmp_path / "runs" / "seed3"
    own = base / "demos" / "mujoco-pick-any-rgb0-wrist-n50-noise0.3-s3"
    (own / "meta").mkdir(parents=True)
    (own / "meta" / "info.json").write_text("{}")
    assert grape.with_demos(3, base, "", ["--x", "a{seed}"]) == ["--x", "a3"]
    assert grape.with_demos(3, base, "", ["--tpo.demo_bc", "10"]) == ["--tpo.demo_bc", "10", "--tpo.demos", str(own)]
    named = ["--tpo.demo_bc", "10", "--tpo.demos", "d/s{seed}"]
    assert grape.with_demos(3, base, "", named) == ["--tpo.demo_bc", "10", "--tpo.demos", "d/s3"]
    recorded = tmp_path / "sft_policy"  # a policy that names its demos: vla-rl align reads them itself
    recorded.mkdir()
    (recorded / "sft.json").write_text('{"dataset": "/d"}')
    assert grape.with_demos(3, base, "x", ["--tpo.demo_bc", "10"], recorded) == ["--tpo.demo_bc", "10"]
    default = tmp_path / "home" / "demos" / own.name
    with pytest.raises(FileNotFoundError, match=f"no quickstart demos for seed 3 at {default}"):
        grape.with_demos(3, base, "qs{seed}/sft_policy", ["--tpo.demo_bc", "10"])


def test_a_run_without_a_checkpoint_that_verifies_is_named(tmp_path):
    (tmp_path / "align-task" / "checkpoints").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="align-task/checkpoints: no checkpoint that verifies"):
        grape.on_task_episodes(tmp_path, tmp_path / "policy", 4)


def test_the_target_column_says_when_success_fell_below_its_start():
    """A safety run whose collisions fell enough but whose success fell below its start's interval reads as
    that, not as a bare 'not met'; a task run's miss, and a run inside the interval, stay plain."""
    row = {"objective": "safety", "target_met": False, "success_before_ci": [0.68, 0.77], "success_after": 0.64}
    assert grape.verdict(row) == "not met: success below its start's interval"
    assert grape.verdict({**row, "success_after": 0.70}) == "not met"
    assert grape.verdict({**row, "objective": "task"}) == "not met"
    assert grape.verdict({**row, "target_met": True}) == "met"
