"""``benchmarks/prm_payments.py``: an episode's PRM payment is its return less its success term, split by success,
a run rewarded otherwise is refused by name, and the published section is its render of its results file."""

import json

import pytest
import torch

from tests.benchmarks import ROOT, docs_section, load_benchmark

pp = load_benchmark("prm_payments")


def _trace(path, weights, episodes):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"version": 1, "weights": weights, "episodes": episodes}, path)


def test_payments_split_the_return_less_success_by_outcome(tmp_path):
    run = tmp_path / "run"
    w = [["success", 1.0], ["prm", 0.5]]
    _trace(run / "reward_terms" / "iter_000001.pt", w, [{"ret": 1.3, "success": True}, {"ret": 0.1, "success": False}])
    _trace(run / "reward_terms" / "iter_000002.pt", w, [{"ret": 1.5, "success": True}, {"ret": -0.1, "success": False},
                                                        {"ret": 0.3, "success": False}])
    row = pp.payments(run)
    assert row["success_mean"] == pytest.approx(0.4) and row["success_n"] == 2
    assert row["failure_mean"] == pytest.approx(0.1) and row["failure_n"] == 3
    assert row["failure_sd"] == pytest.approx((2 * 0.0 ** 2 + 0.2 ** 2 + 0.2 ** 2) ** 0.5 / 3 ** 0.5)
    assert row["prm_weights"] == [0.5] and row["traces"] == 2
    assert pp.payments(run, every=2)["traces"] == 1  # every other trace: the first only
    assert pp.payments(run, every=2)["success_mean"] == pytest.approx(0.3)


def test_payments_refuse_a_run_without_traces_or_with_other_terms(tmp_path):
    with pytest.raises(ValueError, match="no reward traces"):
        pp.payments(tmp_path)
    _trace(tmp_path / "reward_terms" / "iter_000001.pt", [["success", 1.0], ["grasp", 0.1]], [])
    with pytest.raises(ValueError, match=r"iter_000001\.pt: weights .* are not \{success, prm\}"):
        pp.payments(tmp_path)


def test_published_section_is_the_render_of_the_results_file():
    data = json.loads((ROOT / "benchmarks" / "results" / "prm_payments.json").read_text())
    assert docs_section(pp.TITLE) == pp.render(data["rows"], data["command"]).strip("\n")
