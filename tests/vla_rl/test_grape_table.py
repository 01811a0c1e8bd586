"""The published GRAPE table (``docs/benchmarks.md``) is what ``benchmarks/grape.py --render`` makes of
``benchmarks/results/grape.json``, so the numbers in the docs can be traced to the results file."""

import importlib.util
import json
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("grape_bench", _ROOT / "benchmarks" / "grape.py")
grape = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(grape)


def _docs_section(text: str, title: str) -> str:
    body = text.split(f"\n{title}\n", 1)[1]
    return body.split("\n## ", 1)[0].strip("\n")


def test_docs_table_is_rendered_from_the_results_file():
    result = json.loads((_ROOT / "benchmarks" / "results" / "grape.json").read_text())
    docs = _docs_section((_ROOT / "docs" / "benchmarks.md").read_text(), grape.SECTION)
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
    assert _docs_section(text, grape.SECTION) == grape.section(result).strip("\n")
    assert "| 0 | task |" in text and "| 1 | task |" not in text
