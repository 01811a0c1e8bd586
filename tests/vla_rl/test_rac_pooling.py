"""``benchmarks/rac.py`` pools seeds with equal weight, whatever each seed's number of training draws."""

import pytest
from scipy.stats import t

from tests.benchmarks import load_benchmark
from vla_rl.evaluation import wilson_interval

rac = load_benchmark("rac")


def test_a_seed_with_two_draws_does_not_count_twice():
    two_draws = rac.combine([{"success": 0.6, "episodes": 400, "ci": [0, 1], "operator_steps": 3600,
                              "recovery_steps": 0, "correction_steps": 3600, "takeover_episodes": 9,
                              "finetune_wall_s": 1.0, "eval_wall_s": 1.0, "wall_s": 2.0}] * 2)
    one_draw = {"success": 0.3, "episodes": 400}
    assert two_draws["episodes"] == 800
    pool = rac.seed_pooled([two_draws, one_draw])
    assert pool["success"] == pytest.approx(0.45)  # pooling episodes would give (480 + 120) / 1200 = 0.5
    assert pool["episodes"] == 1200 and pool["effective_episodes"] == round(4 / (1 / 800 + 1 / 400))
    width = pool["ci"][1] - pool["ci"][0]
    at = {n: wilson_interval(0.45 * n, n) for n in (800, 1200)}
    assert at[1200][1] - at[1200][0] < width < at[800][1] - at[800][0]


def test_equal_draws_pool_as_the_episodes_do():
    rows = [{"success": 0.25, "episodes": 400}, {"success": 0.5, "episodes": 400}, {"success": 0.4, "episodes": 400}]
    pool = rac.seed_pooled(rows)
    assert pool["success"] == pytest.approx(460 / 1200)
    assert pool["ci"] == pytest.approx(list(wilson_interval(460, 1200)))


def test_verdict_on_the_arms_of_one_test():
    """Seeds run with only ``rac_third`` and ``demos`` (a check on more seeds) get that test's verdict alone."""
    results = [{"seed": s, "base": {"success": 0.2, "episodes": 400},
                "rac_third": {"success": 0.3 + s / 10, "episodes": 400, "operator_steps": 1200},
                "demos": {"success": 0.35, "episodes": 400, "operator_steps": 3600}} for s in (0, 1)]
    pool = {arm: rac.pooled(results, arm) for arm in ("base", "rac_third", "demos")}
    text = rac.verdict(pool, results)
    assert "DAgger" not in text
    assert "RaC on a third of the budget: 0.350 (2400 operator steps)" in text
    assert "at least the demos arm on 1 of 2" in text


def test_verdict_without_a_test_on_every_seed():
    results = [{"seed": 0, "base": {"success": 0.2, "episodes": 400}, "demos": {"success": 0.3, "episodes": 400,
                                                                              "operator_steps": 3600}}]
    pool = {arm: rac.pooled(results, arm) for arm in ("base", "demos")}
    assert "no test's arms" in rac.verdict(pool, results)


def test_where_episodes_stop_is_the_share_reaching_each_stage():
    """The stage table reads each arm's ``furthest_stage`` (8 stages on pick-place-stack; a success counts all 8)."""
    assert rac.reached([0, 2, 8, 8]) == [0.75, 0.75, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]
    assert rac.reached([]) == [0.0] * 8
    arm = {"success": 0.5, "episodes": 4, "furthest_stage": [0, 3, 4, 8]}
    summary = {"seeds": [{"seed": 3, "base": {"success": 0.1, "episodes": 4}, "rac_third": arm}],
               "pooled": {"base": {}, "rac_third": {}}}
    lines = rac.stage_table(summary)
    assert lines[2].startswith("| seed | arm | episodes | reach | grasp | lift | place | reach2 |")
    assert lines[4] == "| 3 | rac_third | 4 | 0.75 | 0.75 | 0.75 | 0.50 | 0.25 | 0.25 | 0.25 | 0.25 |"
    assert len(lines) == 6  # the base row has no stages recorded: left out
    assert rac.stage_table({"seeds": summary["seeds"][:0], "pooled": {}}) == []


def test_the_interval_over_draws_counts_their_spread():
    """Seeds whose draws disagree get a wider interval than the episodes alone give; one draw somewhere: none."""
    def seed(*draws):
        return {"success": sum(draws) / len(draws), "episodes": 400 * len(draws),
                "draws": [{"success": d, "ci": [0, 1], "operator_steps": 1} for d in draws]}

    steady = [seed(0.40, 0.41), seed(0.30, 0.31), seed(0.50, 0.50)]
    spread = [seed(0.30, 0.51), seed(0.20, 0.41), seed(0.45, 0.55)]
    lo, hi = rac.draw_interval(spread)
    mean = (0.405 + 0.305 + 0.50) / 3
    # by hand: two draws a seed, so each seed adds (a - b)^2 / 2 to the squared deviations, over 3 degrees of
    # freedom; the mean over 3 seeds of 2-draw means has variance s_p^2 * (3 / 2) / 9
    pairs = ((0.30, 0.51), (0.20, 0.41), (0.45, 0.55))
    var = sum((a - b) ** 2 / 2 for a, b in pairs) / 3 * 1.5 / 9
    dof = 3
    assert (lo + hi) / 2 == pytest.approx(mean)
    assert hi - lo == pytest.approx(2 * t.ppf(0.975, dof) * var**0.5)
    episodes_only = rac.seed_pooled(spread)["ci"]
    assert hi - lo > episodes_only[1] - episodes_only[0]
    s_lo, s_hi = rac.draw_interval(steady)
    assert s_hi - s_lo < hi - lo
    assert rac.draw_interval([seed(0.3, 0.4), {"success": 0.2, "episodes": 400}]) is None
    assert "disjoint" in rac.draws_said([0.4, 0.5], [0.2, 0.3]) and "overlapping" in rac.draws_said([0.2, 0.5],
                                                                                                  [0.3, 0.4])
