"""The TPO loss on hand-computed values, and the TPO learner on hand-made preference pairs, for every policy kind:
the chosen trajectory's likelihood rises relative to the rejected one's (against the policy at the start of the
round)."""

from __future__ import annotations

import math

import pytest
import torch

from policies.base import ActMode, Policy
from vla_rl.algorithms.base import ALGORITHMS, IterationInputs, Needs
from vla_rl.grape.sampling import RoundData
from vla_rl.grape.tpo import TPOConfig, TPOLearner, tpo_loss
from vla_rl.grape.trajectory import PreferencePair, Trajectory, trajectory_logp
from vla_rl.policy_factory import build_policy_from_fields

torch.set_num_threads(1)
KINDS = ["compact-flow", "pi0", "pi05", "smolvla", "openvla-style"]
DERIVED = {"action_dim": 3, "state_dim": 5, "cameras": ("front",), "image_size": (32, 32)}
MARGIN = 0.5  # nats of log pi(tau_w) / pi_ref(tau_w) - log pi(tau_l) / pi_ref(tau_l) after a few steps


def _obs(t: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"observation.images.front": torch.randint(0, 256, (t, 32, 32, 3), dtype=torch.uint8, generator=g),
            "observation.state": torch.randn(t, 5, generator=g), "task": ["pick up the red cube"] * t}


def _trajectory(policy, tid: int, seed: int, t: int = 2) -> Trajectory:
    obs = _obs(t, seed)
    with torch.no_grad():
        out = policy.act(obs, ActMode.EXPLORE)
    return Trajectory(id=tid, state=0, seed=seed, obs=obs, actions=out.actions, extras=out.extras,
                      logp=out.logp.reshape(t, -1).mean(-1), success=tid == 0, steps=t, costs={}, stage_costs={})


def _t64(values: list | float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_tpo_loss_hand_computed() -> None:
    logp_w = _t64([-1.0, -2.0]).requires_grad_(True)
    logp_l = _t64([-3.0, -1.0])
    ref_w, ref_l = _t64([-1.5, -2.0]), _t64([-2.5, -1.5])
    loss, stats = tpo_loss(logp_w, logp_l, ref_w, ref_l, 0.1)
    # rho_w = .1 * [.5, 0] = [.05, 0]; rho_l = .1 * [-.5, .5] = [-.05, .05]; margins [.1, -.05]
    # -log sigmoid(m) = log(1 + e^{-m})
    expected = (math.log1p(math.exp(-0.1)) + math.log1p(math.exp(0.05))) / 2
    torch.testing.assert_close(loss, _t64(expected))
    torch.testing.assert_close(stats["reward_margin"], _t64(0.025))
    torch.testing.assert_close(stats["reward_chosen"], _t64(0.025))
    torch.testing.assert_close(stats["reward_rejected"], _t64(0.0))
    torch.testing.assert_close(stats["accuracy"], _t64(0.5))
    loss.backward()
    # d/dlogp_w of -log sigmoid(m) = -beta * sigmoid(-m) = -beta / (1 + e^m); / P = 2
    torch.testing.assert_close(logp_w.grad, _t64([-0.1 / (1 + math.exp(0.1)) / 2, -0.1 / (1 + math.exp(-0.05)) / 2]))


def test_tpo_loss_chosen_penalty_hand_computed() -> None:
    """DPO-Positive: only a chosen trajectory that lost likelihood against the reference is charged, lambda per nat."""
    logp_w = _t64([-1.0, -2.5]).requires_grad_(True)  # pair 0 gained 0.5 nats, pair 1 lost 0.5
    logp_l, ref_w, ref_l = _t64([-3.0, -3.0]), _t64([-1.5, -2.0]), _t64([-2.5, -2.5])
    loss, stats = tpo_loss(logp_w, logp_l, ref_w, ref_l, 0.1, chosen_penalty=4.0)
    # margins: [.1 * .5 + .1 * .5, .1 * -.5 + .1 * .5] = [.1, 0]; penalty: [0, .1 * 4 * .5] = [0, .2]
    expected = (math.log1p(math.exp(-0.1)) + math.log1p(math.exp(0.2))) / 2
    torch.testing.assert_close(loss, _t64(expected))
    torch.testing.assert_close(stats["chosen_drop"], _t64(0.25))
    torch.testing.assert_close(stats["reward_margin"], _t64(0.05))  # the margin itself is not changed
    loss.backward()
    # pair 1's chosen gets the DPO pull plus lambda times it: -beta (1 + lambda) sigmoid(-(0 - .2)) / 2
    torch.testing.assert_close(logp_w.grad[1], _t64(-0.1 * 5.0 / (1 + math.exp(-0.2)) / 2))
    plain, _ = tpo_loss(logp_w.detach(), logp_l, ref_w, ref_l, 0.1)
    assert float(plain) < float(loss.detach())
    with pytest.raises(ValueError, match="chosen_penalty must be >= 0"):
        tpo_loss(logp_w, logp_l, ref_w, ref_l, 0.1, chosen_penalty=-1.0)


def test_tpo_loss_rejects_bad_inputs() -> None:
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="beta must be > 0"):
        tpo_loss(x, x, x, x, 0.0)
    with pytest.raises(ValueError, match=r"ref_logp_rejected shape \(2,\)"):
        tpo_loss(x, x, x, torch.zeros(2), 0.1)
    with pytest.raises(ValueError, match=r"logp_chosen must be \[P\]"):
        tpo_loss(torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(3, 2), 0.1)


def test_tpo_is_registered_and_needs_preferences():
    entry = ALGORITHMS.get("tpo")
    assert entry.obj is TPOLearner and entry.config is TPOConfig and TPOLearner.needs is Needs.PREFERENCES
    with pytest.raises(ValueError, match="algo.beta must be > 0"):
        TPOConfig(beta=0.0)


@pytest.mark.parametrize("kind", KINDS)
def test_tpo_raises_the_chosen_trajectorys_likelihood_relative_to_the_rejected(kind: str):
    torch.manual_seed(0)
    policy = build_policy_from_fields(kind, {}, DERIVED, smoke=True)
    chosen, rejected = _trajectory(policy, 0, seed=1), _trajectory(policy, 1, seed=2)
    pairs = [PreferencePair(0, chosen, rejected)]
    policy.eval()
    with torch.no_grad():
        ref_c, ref_r = trajectory_logp(policy, chosen), trajectory_logp(policy, rejected)
    learner = TPOLearner(TPOConfig(lr=1e-3, epochs=6, beta=0.1), policy)
    batch = learner.collect(IterationInputs(iteration=0, seed_base=0, reset=True, data=pairs))
    stats = learner.update(batch)
    with torch.no_grad():
        new_c, new_r = trajectory_logp(policy, chosen), trajectory_logp(policy, rejected)
    margin = float((new_c - ref_c) - (new_r - ref_r))
    assert margin > MARGIN, (kind, margin, stats)
    assert stats["update/pairs"] == 1.0 and stats["update/reward_margin"] > 0


def test_empty_batch_changes_nothing():
    torch.manual_seed(0)
    policy = build_policy_from_fields("compact-flow", {}, DERIVED, smoke=True)
    before = [p.clone() for p in policy.parameters()]
    assert TPOLearner(TPOConfig(), policy).update([]) == {"update/pairs": 0.0}
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))


def test_chosen_penalty_keeps_the_chosen_trajectory_likely():
    """Pure TPO at a large step lowers the chosen trajectory's likelihood with the rejected one's; with
    DPO-Positive's penalty it loses under a tenth as much, and the drop is reported."""
    ends = {}
    for penalty in (0.0, 50.0):
        torch.manual_seed(0)
        policy = build_policy_from_fields("compact-flow", {}, DERIVED, smoke=True)
        chosen, rejected = _trajectory(policy, 0, seed=1, t=3), _trajectory(policy, 1, seed=2, t=3)
        policy.eval()
        with torch.no_grad():
            ref = float(trajectory_logp(policy, chosen))
        stats = TPOLearner(TPOConfig(lr=3e-3, epochs=10, beta=1.0, chosen_penalty=penalty), policy).update(
            [PreferencePair(0, chosen, rejected)])
        with torch.no_grad():
            ends[penalty] = float(trajectory_logp(policy, chosen)) - ref
        assert "update/chosen_drop" in stats
    assert ends[0.0] < 0 and ends[50.0] > 0.1 * ends[0.0], ends  # loses under a tenth of what plain TPO loses
    with pytest.raises(ValueError, match="algo.chosen_penalty"):
        TPOConfig(chosen_penalty=-1.0)


def test_chosen_nll_raises_the_chosen_trajectorys_likelihood():
    """Where pure TPO at a large step lowers the chosen trajectory's likelihood (by hundreds of nats), RPO's NLL term
    (``chosen_nll``) holds it near the reference and, weighted more, raises it; the pair stays ordered, and the
    per-decision NLL it adds is reported."""
    ends = {}
    for alpha in (0.0, 1.0, 10.0):
        torch.manual_seed(0)
        policy = build_policy_from_fields("compact-flow", {}, DERIVED, smoke=True)
        chosen, rejected = _trajectory(policy, 0, seed=1, t=3), _trajectory(policy, 1, seed=2, t=3)
        policy.eval()
        with torch.no_grad():
            ref_c, ref_r = float(trajectory_logp(policy, chosen)), float(trajectory_logp(policy, rejected))
        stats = TPOLearner(TPOConfig(lr=3e-3, epochs=10, beta=1.0, chosen_nll=alpha), policy).update(
            [PreferencePair(0, chosen, rejected)])
        with torch.no_grad():
            new_c, new_r = float(trajectory_logp(policy, chosen)), float(trajectory_logp(policy, rejected))
        ends[alpha] = new_c - ref_c
        assert (new_c - ref_c) - (new_r - ref_r) > MARGIN, (alpha, stats)
        assert ("update/chosen_nll" in stats) == (alpha > 0)
    assert ends[0.0] < 0 and ends[1.0] > 0.05 * ends[0.0] and ends[10.0] > 0, ends
    with pytest.raises(ValueError, match="algo.chosen_nll"):
        TPOConfig(chosen_nll=-1.0)


def _without_sft_loss() -> Policy:
    """The compact flow policy with the base class's missing supervised loss: a policy that cannot imitate."""
    policy = build_policy_from_fields("compact-flow", {}, DERIVED, smoke=True)
    policy.__class__ = type("NoSFT", (type(policy),), {"sft_loss": Policy.sft_loss})
    return policy


@pytest.mark.parametrize("kind", ["compact-flow", "pi0", "openvla-style"])
def test_chosen_bc_imitates_the_chosen_successs_actions(kind: str):
    """``chosen_bc`` adds the policy's own supervised loss on the chosen success's executed chunks: after the update
    the deterministic policy's actions on its observations are nearer to them than after pure TPO, and the loss is
    reported; a chosen failure is not imitated."""
    def run(weight: float, chosen_id: int = 0) -> tuple[float, dict]:
        torch.manual_seed(0)
        policy = build_policy_from_fields(kind, {}, DERIVED, smoke=True)
        chosen, rejected = _trajectory(policy, chosen_id, seed=1, t=3), _trajectory(policy, 1, seed=2, t=3)
        stats = TPOLearner(TPOConfig(lr=3e-3, epochs=10, beta=1.0, chosen_bc=weight), policy).update(
            [PreferencePair(0, chosen, rejected)])
        policy.eval()
        with torch.no_grad():
            policy.reset()
            got = policy.act(chosen.obs, ActMode.EVAL).actions
        return float((got - chosen.actions).abs().mean()), stats

    (pure, pure_stats), (imitated, stats) = run(0.0), run(10.0)
    assert imitated < 0.7 * pure and stats["update/chosen_bc"] > 0, (pure, imitated)
    assert "update/chosen_bc" not in pure_stats
    assert "update/chosen_bc" not in run(10.0, chosen_id=2)[1]
    with pytest.raises(ValueError, match="algo.chosen_bc"):
        TPOConfig(chosen_bc=-1.0)
    with pytest.raises(ValueError, match=r"algo.chosen_bc needs a policy with a supervised loss; NoSFT has none \(set"):
        TPOLearner(TPOConfig(chosen_bc=1.0), _without_sft_loss())


def _after_update(chosen_id: int, **cfg) -> tuple[float, float, dict]:
    """(chosen, rejected) log-likelihood change after 10 epochs on one pair; trajectory 0 is the only success."""
    torch.manual_seed(0)
    policy = build_policy_from_fields("compact-flow", {}, DERIVED, smoke=True)
    chosen, rejected = _trajectory(policy, chosen_id, seed=1, t=3), _trajectory(policy, 1, seed=2, t=3)
    policy.eval()
    with torch.no_grad():
        ref_c, ref_r = float(trajectory_logp(policy, chosen)), float(trajectory_logp(policy, rejected))
    stats = TPOLearner(TPOConfig(lr=3e-3, epochs=10, beta=1.0, **cfg), policy).update([PreferencePair(0, chosen, rejected)])
    with torch.no_grad():
        return float(trajectory_logp(policy, chosen)) - ref_c, float(trajectory_logp(policy, rejected)) - ref_r, stats


def test_nll_on_successes_only_orders_two_failures_without_imitating_the_better_one():
    """With ``nll_successes_only`` a pair of two failures trains exactly as pure TPO does (no NLL pull on the chosen
    failure), while a pair whose chosen trajectory succeeded still gets the NLL term."""
    pure = _after_update(2, chosen_nll=0.0)
    failure = _after_update(2, chosen_nll=10.0, nll_successes_only=True)
    assert failure[0] == pytest.approx(pure[0], abs=1e-4) and failure[1] == pytest.approx(pure[1], abs=1e-4)
    assert "update/chosen_nll" not in failure[2] and failure[0] - failure[1] > MARGIN
    imitated = _after_update(2, chosen_nll=10.0)  # the default: the chosen failure is pulled up too
    assert imitated[0] > pure[0] + 1.0 and "update/chosen_nll" in imitated[2]
    success = _after_update(0, chosen_nll=10.0, nll_successes_only=True)
    assert success[:2] == pytest.approx(_after_update(0, chosen_nll=10.0)[:2], abs=1e-4)
    assert "update/chosen_nll" in success[2]


def test_tpo_on_instruction_pairs_binds_a_trajectory_to_its_own_instruction():
    """A success paired against itself under another instruction (``grape.instruction_pairs``): after TPO the
    trajectory is more likely under its own instruction than under the other, against the reference."""
    import dataclasses

    from vla_rl.grape.pairs import instruction_pairs

    torch.manual_seed(0)
    policy = build_policy_from_fields("compact-flow", {}, DERIVED, smoke=True)
    success = _trajectory(policy, 0, seed=1, t=3)
    pairs = instruction_pairs([success], ["pick up the red cube", "pick up the blue cube"], m=1)
    assert len(pairs) == 1 and pairs[0].rejected.obs["task"] == ["pick up the blue cube"] * 3
    policy.eval()
    with torch.no_grad():
        ref = float(trajectory_logp(policy, success) - trajectory_logp(policy, pairs[0].rejected))
    stats = TPOLearner(TPOConfig(lr=1e-3, epochs=6, beta=1.0), policy).update(pairs)
    with torch.no_grad():
        gap = float(trajectory_logp(policy, success) - trajectory_logp(policy, pairs[0].rejected))
        other = dataclasses.replace(success, obs={**success.obs, "task": ["pick up the green cube"] * 3})
        assert torch.isfinite(trajectory_logp(policy, other))
    assert gap - ref > MARGIN, (ref, gap, stats)


def test_demo_bc_imitates_the_demos_beside_the_preference(tmp_path):
    """``demo_bc`` adds the policy's supervised loss on demo rows to every step (the pre-training mix): after the
    update the demos' loss is lower than after pure TPO from the same start, the preference margin still grows, and
    the term is reported; bad settings name their field."""
    from tests.vla_rl.test_data import ACT, STATE, write_lerobot_dataset
    from vla_rl.data.dataset import load_chunks, policy_inputs

    demos = write_lerobot_dataset(tmp_path / "demos", episodes=3, length=6, camera=8)
    fields = {"action_dim": ACT, "state_dim": STATE, "cameras": ("front",), "image_size": (8, 8)}

    def trajectory(policy, tid: int, seed: int) -> Trajectory:
        g = torch.Generator().manual_seed(seed)
        obs = {"observation.images.front": torch.randint(0, 256, (3, 8, 8, 3), dtype=torch.uint8, generator=g),
               "observation.state": torch.randn(3, STATE, generator=g), "task": ["reach the target"] * 3}
        with torch.no_grad():
            out = policy.act(obs, ActMode.EXPLORE)
        return Trajectory(id=tid, state=0, seed=seed, obs=obs, actions=out.actions, extras=out.extras,
                          logp=out.logp.reshape(3, -1).mean(-1), success=tid == 0, steps=3, costs={}, stage_costs={})

    def run(weight: float) -> tuple[float, float, dict]:
        torch.manual_seed(0)
        policy = build_policy_from_fields("compact-flow", {}, fields, smoke=True)
        chosen, rejected = trajectory(policy, 0, seed=1), trajectory(policy, 1, seed=2)
        rows = load_chunks(demos, policy_inputs(policy), policy.chunk_size)
        policy.eval()
        with torch.no_grad():
            ref = float(trajectory_logp(policy, chosen) - trajectory_logp(policy, rejected))
        cfg = TPOConfig(lr=3e-3, epochs=10, beta=1.0, demos=str(demos) if weight else "", demo_bc=weight)
        stats = TPOLearner(cfg, policy).update([PreferencePair(0, chosen, rejected)])
        policy.eval()
        with torch.no_grad():
            torch.manual_seed(1)  # the flow-matching loss draws its noise and times: the same draw for both runs
            loss = float(policy.sft_loss(rows.obs, rows.actions, rows.mask))
            margin = float(trajectory_logp(policy, chosen) - trajectory_logp(policy, rejected)) - ref
        return loss, margin, stats

    (pure, pure_margin, pure_stats), (mixed, margin, stats) = run(0.0), run(10.0)
    assert mixed < 0.7 * pure, (pure, mixed)
    assert margin > MARGIN and pure_margin > MARGIN, (pure_margin, margin)
    assert stats["update/demo_bc"] > 0 and "update/demo_bc" not in pure_stats
    with pytest.raises(ValueError, match="algo.demo_bc imitates demos: name their LeRobotDataset with algo.demos"):
        TPOLearner(TPOConfig(demo_bc=1.0), build_policy_from_fields("compact-flow", {}, fields, smoke=True))
    with pytest.raises(ValueError, match="algo.demos='d' is read only with algo.demo_bc > 0"):
        TPOConfig(demos="d")
    with pytest.raises(ValueError, match="algo.demo_batch must be >= 1"):
        TPOConfig(demos="d", demo_bc=1.0, demo_batch=0)
    with pytest.raises(ValueError, match="algo.demo_bc needs a policy with a supervised loss; NoSFT"):
        TPOLearner(TPOConfig(demos="d", demo_bc=1.0), _without_sft_loss())


def test_tpo_refuses_several_processes_and_names_the_way_out():
    """Each rank would pair its own rollouts and step a different number of times: the learner refuses a
    distributed run before it starts, and one process is accepted."""
    from types import SimpleNamespace

    from vla_rl.config import ConfigError
    from vla_rl.distributed import SINGLE

    learner = TPOLearner(TPOConfig(), build_policy_from_fields("compact-flow", {}, DERIVED, smoke=True))
    learner.distribute(SINGLE)
    assert learner.dist is SINGLE
    with pytest.raises(ConfigError, match="algo.type tpo trains in one process.*without accelerate launch"):
        learner.distribute(SimpleNamespace(enabled=True))


def test_replay_imitates_earlier_rounds_successes_beside_the_pairs():
    """``replay_rounds`` with ``chosen_bc``: each step also imitates ``replay_batch`` of the earlier successes its round
    hands ``update``, so the deterministic policy's actions on a replayed success's observations, and its supervised
    loss there, move toward that success's executed chunks more than the same update without the replay; the pool's
    size is reported. Config errors name the field."""
    def run(replay: bool) -> tuple[float, float, dict]:
        torch.manual_seed(0)
        policy = build_policy_from_fields("compact-flow", {}, DERIVED, smoke=True)
        chosen, rejected = _trajectory(policy, 0, seed=1, t=3), _trajectory(policy, 1, seed=2, t=3)
        earlier = _trajectory(policy, 0, seed=7, t=3)
        earlier.actions = earlier.actions + 0.5  # away from what the policy plays there
        cfg = TPOConfig(lr=3e-3, epochs=10, beta=1.0, chosen_bc=10.0, replay_rounds=1, replay_batch=2)
        batch = RoundData([], [PreferencePair(0, chosen, rejected)], [], replay=[earlier] if replay else [])
        stats = TPOLearner(cfg, policy).update(batch)
        policy.eval()
        with torch.no_grad():
            policy.reset()
            got = policy.act(earlier.obs, ActMode.EVAL).actions
            torch.manual_seed(5)  # the same flow-matching noise and times for both
            loss = float(policy.sft_loss(earlier.obs, earlier.actions))
        return float((got - earlier.actions).abs().mean()), loss, stats

    (far, high, plain), (near, low, stats) = run(False), run(True)
    assert near < 0.85 * far and low < 0.85 * high, (far, near, high, low)  # 0.99 -> 0.76 and 2.51 -> 1.98
    assert stats["update/replay_pool"] == 1.0 and "update/replay_pool" not in plain
    with pytest.raises(ValueError, match="algo.replay_rounds=2 adds earlier successes to chosen_bc"):
        TPOConfig(replay_rounds=2)
    with pytest.raises(ValueError, match="algo.replay_batch must be >= 1"):
        TPOConfig(chosen_bc=1.0, replay_rounds=1, replay_batch=0)
    policy = build_policy_from_fields("compact-flow", {}, DERIVED, smoke=True)
    learner = TPOLearner(TPOConfig(chosen_bc=1.0, replay_rounds=1), policy)
    with pytest.raises(ValueError, match="algo.replay_rounds replays earlier rounds' successes"):
        learner.collect(IterationInputs(iteration=0, seed_base=0, reset=True, data=None, engine=object()))


def test_bc_lr_steps_the_imitation_at_its_own_rate_and_resumes_both_optimizers():
    """``bc_lr`` gives ``chosen_bc`` its own AdamW: Adam's first step moves each parameter by about its rate whatever
    the loss weight, so with one optimizer the step of a preference rate of 1e-6 stays about 1e-6 (``chosen_bc`` 10
    included), and with ``bc_lr`` 1e-3 the imitation moves the weights by about 1e-3. Both optimizers' state
    survives ``state_dict`` / ``load_state_dict``. Config errors name the field."""
    def run(bc_lr: float) -> tuple[float, TPOLearner]:
        torch.manual_seed(0)
        policy = build_policy_from_fields("compact-flow", {}, DERIVED, smoke=True)
        chosen, rejected = _trajectory(policy, 0, seed=1, t=3), _trajectory(policy, 1, seed=2, t=3)
        before = [p.detach().clone() for p in policy.actor_parameters()]
        learner = TPOLearner(TPOConfig(lr=1e-6, bc_lr=bc_lr, epochs=1, beta=1.0, chosen_bc=10.0), policy)
        learner.update([PreferencePair(0, chosen, rejected)])
        step = max(float((p.detach() - b).abs().max()) for p, b in zip(policy.actor_parameters(), before))
        return step, learner

    (shared, one), (own, two) = run(0.0), run(1e-3)
    assert shared < 2e-6 and 9e-4 < own < 1.1e-3, (shared, own)
    assert len(one.optimizers()) == 1 and len(two.optimizers()) == 2
    fresh = TPOLearner(two.cfg, build_policy_from_fields("compact-flow", {}, DERIVED, smoke=True))
    fresh.load_state_dict(two.state_dict())
    steps = [[float(s["step"]) for s in o.state_dict()["state"].values()] for o in fresh.optimizers()]
    assert all(steps) and all(n == 1.0 for group in steps for n in group), steps
    assert fresh.bc_optimizer.param_groups[0]["lr"] == 1e-3
    with pytest.raises(ValueError, match="algo.bc_lr=0.001 is the rate of the imitation terms"):
        TPOConfig(bc_lr=1e-3)
    with pytest.raises(ValueError, match="algo.bc_lr must be >= 0"):
        TPOConfig(bc_lr=-1.0, chosen_bc=1.0)


def test_preference_false_trains_the_imitation_terms_alone():
    """The ablation ``preference`` false: the update no longer depends on the rejected trajectory (with the
    preference loss it does) and the chosen success is still imitated (chain NLL and action BC). Config errors say
    what the ablation drops."""
    def run(rejected_seed: int, **cfg) -> tuple[list[torch.Tensor], dict]:
        torch.manual_seed(0)
        policy = build_policy_from_fields("compact-flow", {}, DERIVED, smoke=True)
        chosen, rejected = _trajectory(policy, 0, seed=1, t=3), _trajectory(policy, 1, seed=rejected_seed, t=3)
        learner = TPOLearner(TPOConfig(lr=3e-3, epochs=3, beta=1.0, chosen_nll=1.0, chosen_bc=1.0, **cfg), policy)
        stats = learner.update([PreferencePair(0, chosen, rejected)])
        return [p.detach().clone() for p in policy.actor_parameters()], stats

    def gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
        return max(float((x - y).abs().max()) for x, y in zip(a, b))

    (a, stats), (b, _) = run(2, preference=False), run(3, preference=False)
    assert gap(a, b) == 0.0 and "update/tpo_loss" not in stats
    assert {"update/chosen_nll", "update/chosen_bc"} <= stats.keys()
    torch.manual_seed(0)
    start = [p.detach().clone() for p in build_policy_from_fields("compact-flow", {}, DERIVED, smoke=True)
             .actor_parameters()]
    assert gap(a, start) > 1e-3  # the imitation terms moved the weights
    (c, with_pref), (d, _) = run(2), run(3)
    assert gap(c, d) > 1e-4 and "update/tpo_loss" in with_pref
    with pytest.raises(ValueError, match="algo.preference false leaves nothing to train"):
        TPOConfig(preference=False)
    with pytest.raises(ValueError, match="algo.chosen_penalty=0.5 is part of the preference loss"):
        TPOConfig(preference=False, chosen_bc=1.0, chosen_penalty=0.5)
