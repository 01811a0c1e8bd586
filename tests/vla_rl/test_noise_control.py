"""``benchmarks/ppo_noise_control.py``: its noise control shuffles advantages and nothing else, it reads the
reference runs from the learned-rewards results, and the published section is its render of its results file."""

import json

import pytest
import torch

from tests.benchmarks import ROOT, docs_section, load_benchmark

nc = load_benchmark("ppo_noise_control")


def test_shuffle_within_permutes_only_the_valid_decisions():
    adv = torch.arange(12, dtype=torch.float32).view(4, 3)
    mask = torch.ones(4, 3, dtype=torch.bool)
    mask[3] = False  # the last decision of each env is invalid
    out = nc.shuffle_within(adv, mask, torch.Generator().manual_seed(0))
    assert out.shape == adv.shape
    assert torch.equal(out[3], adv[3])  # invalid entries stay where they are
    assert sorted(out[mask].tolist()) == sorted(adv[mask].tolist())  # the same values...
    assert not torch.equal(out[mask], adv[mask])  # ...in another order
    again = nc.shuffle_within(adv, mask, torch.Generator().manual_seed(0))
    assert torch.equal(out, again)  # the same generator seed, the same permutation
    assert torch.equal(adv, torch.arange(12, dtype=torch.float32).view(4, 3))  # the input is not modified


def test_gate_on_success_zeroes_only_rollouts_without_a_success():
    adv = torch.randn(3, 2)
    without = type("R", (), {"reward_terms": {"success": torch.zeros(3, 2)}})()
    with_one = type("R", (), {"reward_terms": {"success": torch.tensor([[0.0, 0.0], [0.0, 1.0], [0.0, 0.0]])}})()
    assert torch.equal(nc.gate_on_success(adv, without), torch.zeros(3, 2))
    assert nc.gate_on_success(adv, with_one) is adv
    no_term = type("R", (), {"reward_terms": {}})()  # a reward without a success term has nothing to gate on
    assert torch.equal(nc.gate_on_success(adv, no_term), torch.zeros(3, 2))


def test_shuffled_advantages_patches_ppo_while_active_and_restores_it(monkeypatch):
    from vla_rl.algorithms.ppo import PPOLearner

    adv = torch.arange(8, dtype=torch.float32).view(4, 2)
    ret, mask = adv + 100, torch.ones(4, 2, dtype=torch.bool)

    def fake(self, rollout):
        return adv, ret, mask

    monkeypatch.setattr(PPOLearner, "advantages", fake)
    learner = type("L", (), {"iteration": 3})()
    with nc.patched_advantages("shuffle"):
        a, r, m = PPOLearner.advantages(learner, None)
        assert sorted(a.flatten().tolist()) == adv.flatten().tolist() and not torch.equal(a, adv)
        assert r is ret and m is mask  # returns (the critic's targets) and the mask are untouched
        learner.iteration = 4
        assert not torch.equal(PPOLearner.advantages(learner, None)[0], a)  # a new permutation per iteration
    assert PPOLearner.advantages is fake
    with pytest.raises(RuntimeError), nc.patched_advantages("shuffle"):
        raise RuntimeError("a run that fails")
    assert PPOLearner.advantages is fake
    with pytest.raises(ValueError, match="'shuffle' or 'gate'"), nc.patched_advantages("shufle"):
        pass
    assert PPOLearner.advantages is fake


def test_reference_rows_are_cut_to_the_run_length():
    curve = [[i * 30720, 0.1 + i / 100] for i in range(6)]
    rewards = {nc.REFERENCE_SECTIONS[1e-4][0]: {"seeds": {
        "0": {"sparse_curve": curve, "mixed_curve": curve, "preset_a_curve": curve},
        "5": {"sparse_curve": curve}}}}
    rows = nc.reference_rows(rewards, 1e-4, 80, {0})
    assert [(r["variant"], r["seed"]) for r in rows] == [("real", 0), ("PRM + success", 0)]
    assert rows[0]["curve"] == curve[:3] and rows[0]["source"] == nc.REFERENCE_SECTIONS[1e-4][0]
    assert nc.reference_rows(rewards, 3e-5, 80, {0}) == []


def test_docs_section_is_rendered_from_the_results_file():
    result = json.loads(nc.RESULTS.read_text())
    assert docs_section(nc.SECTION) == nc.render(result).strip("\n")
    variants = {r["variant"] for r in result["runs"]}
    assert {"shuffled", "real"} <= variants
    assert (ROOT / "docs" / "img" / nc.PLOT.name).exists()
