"""The published GRAPE table (``docs/benchmarks.md``) is what ``benchmarks/grape.py --render`` makes of
``benchmarks/results/grape.json``, so the numbers in the docs can be traced to the results file."""

import json

from tests.benchmarks import ROOT as _ROOT
from tests.benchmarks import docs_section, load_benchmark

grape = load_benchmark("grape")


def test_docs_table_is_rendered_from_the_results_file():
    result = json.loads((_ROOT / "benchmarks" / "results" / "grape.json").read_text())
    docs = docs_section(grape.SECTION)
    assert docs == grape.section(result).strip("\n")
    seeds = {r["seed"] for r in result["runs"]}
    assert {0, 1, 2} <= seeds and all(f"| {s} | task |" in docs for s in seeds)


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
