"""``benchmarks/prm_payments.py``: an episode's PRM payment is its return less its success term, split by success,
a run rewarded otherwise is refused by name, and the published section is its render of its results file."""

import json

import pytest
import torch

from tests.benchmarks import ROOT, docs_section, load_benchmark
from vla_rl.reweigh import save_reward_trace
from vla_rl.rollout import EpisodeRecord, Rollout

pp = load_benchmark("prm_payments")


def _trace(path, weights, episodes):
    """A reward trace as the trainer writes it (``save_reward_trace``), of one decision, holding ``episodes``."""
    z = torch.zeros(1, 1)
    no = torch.zeros(1, 1, dtype=torch.bool)
    rollout = Rollout(obs={}, actions=torch.zeros(1, 1, 1, 1), logp=z, values=z, extras={}, rewards=z,
                      reward_terms={n: z for n, _ in weights}, terminated=no, truncated=no, next_values=z,
                      valid=~no, group_ids=None, step_reward_terms={n: z[..., None] for n, _ in weights},
                      episodes=[EpisodeRecord(env=0, task="x", ret=r, length=1, success=ok) for r, ok in episodes],
                      env_steps=1)
    save_reward_trace(rollout, path, {"type": "ppo"}, weights)


def test_payments_split_the_return_less_success_by_outcome(tmp_path):
    run = tmp_path / "run"
    w = [("success", 1.0), ("prm", 0.5)]
    _trace(run / "reward_terms" / "iter_000001.pt", w, [(1.3, True), (0.1, False)])
    _trace(run / "reward_terms" / "iter_000002.pt", w, [(1.5, True), (-0.1, False), (0.3, False)])
    row = pp.payments(run)
    assert row["success_mean"] == pytest.approx(0.4) and row["success_n"] == 2
    assert row["failure_mean"] == pytest.approx(0.1) and row["failure_n"] == 3
    assert row["failure_sd"] == pytest.approx((0.08 / 3) ** 0.5)  # deviations 0, -0.2, 0.2
    assert row["prm_weights"] == [0.5] and row["success_weights"] == [1.0] and row["traces"] == 2
    assert pp.payments(run, every=2)["traces"] == 1  # every other trace: the first only
    assert pp.payments(run, every=2)["success_mean"] == pytest.approx(0.3)


def test_payments_refuse_a_run_without_traces_or_with_other_terms(tmp_path):
    with pytest.raises(ValueError, match="no reward traces"):
        pp.payments(tmp_path)
    _trace(tmp_path / "reward_terms" / "iter_000001.pt", [("success", 1.0), ("grasp", 0.1)], [])
    with pytest.raises(ValueError, match=r"iter_000001\.pt: weights .* are not \{success, prm\}"):
        pp.payments(tmp_path)
    (tmp_path / "reward_terms" / "iter_000001.pt").write_text("not a trace")
    with pytest.raises(ValueError, match=r"iter_000001\.pt: not a reward trace"):
        pp.payments(tmp_path)


def test_published_section_is_the_render_of_the_results_file():
    data = json.loads((ROOT / "benchmarks" / "results" / "prm_payments.json").read_text())
    assert docs_section(pp.TITLE) == pp.render(data["rows"], data["command"]).strip("\n")
