"""Rollout engine mechanics and the PPO / GRPO learners on a toy env with known dynamics."""

from __future__ import annotations

import functools

import pytest
import torch

from policies.base import ActMode
from sim.core import OBS_STATE
from sim.vector import SerialVecEnv
from tests.sim.toy_env import CounterEnv
from tests.vla_rl.toy_policy import GaussianPolicy
from vla_rl.algorithms.base import ALGORITHMS, IterationInputs, Needs
from vla_rl.algorithms.ppo import AdvantageEstimator, GRPOConfig, PPOConfig, PPOLearner
from vla_rl.evaluation import evaluate_episodes, wilson_interval
from vla_rl.rollout import RolloutEngine


def _env(n=4, steps=5, goal=2.0):
    return SerialVecEnv([functools.partial(CounterEnv, episode_steps=steps, goal=goal) for _ in range(n)], "toy/counter")


def test_chunk_rewards_stop_at_episode_end_and_bootstrap_from_final_obs():
    torch.manual_seed(0)
    env = _env(n=2, steps=3, goal=100.0)  # never succeeds: every episode truncates after 3 steps
    policy = GaussianPolicy(2, 1, horizon=2, init_mean=0.5)
    engine = RolloutEngine(env, policy)
    engine.reset(seed=0)
    ro = engine.collect(3, ActMode.EVAL)
    # Decision 0: steps 1-2; decision 1: step 3 ends the episode, step 4 is held still in the new one.
    assert ro.actions.shape == (3, 2, 2, 1) and ro.env_steps == 3 * 2 * 2
    assert ro.truncated[1].all() and not ro.truncated[0].any() and not ro.terminated.any()
    # Decision 2 starts at t=1 of the new episode (held step), so the new episode is 1 step in.
    assert (ro.obs[OBS_STATE][2, :, 1] == 1).all()
    # The bootstrap value of the truncated decision is the value of the final obs [init + 3 * 0.5, 3].
    init = ro.obs[OBS_STATE][0, :, 0]
    final = torch.stack([init + 1.5, torch.full_like(init, 3.0)], dim=1)
    with torch.no_grad():
        expected = policy.value({OBS_STATE: final})
    torch.testing.assert_close(ro.next_values[1], expected)
    torch.testing.assert_close(ro.next_values[0], ro.values[1])
    assert [e.length for e in ro.episodes] == [3, 3, 3, 3]  # second episodes end inside decision 2


def test_terminated_decisions_do_not_bootstrap():
    env = _env(n=2, steps=10, goal=0.5)
    policy = GaussianPolicy(2, 1, horizon=2, init_mean=1.0)
    engine = RolloutEngine(env, policy)
    engine.reset(seed=0)
    ro = engine.collect(2, ActMode.EVAL)
    assert ro.terminated[0].all() and (ro.next_values[0] == 0).all()
    assert (ro.rewards[0] == 1.0).all()  # success reward counted once, not again after the auto-reset


def test_group_rollouts_share_initial_states_and_mask_after_the_episode():
    env = _env(n=4, steps=3)
    policy = GaussianPolicy(2, 1, horizon=2)
    engine = RolloutEngine(env, policy, use_critic=False)
    ro = engine.collect_groups(seeds=[10, 11], group_size=2, max_decisions=5)
    first = ro.obs[OBS_STATE][0, :, 0]
    assert first[0] == first[1] and first[2] == first[3]
    assert ro.group_ids.tolist() == [0, 0, 1, 1]
    assert ro.valid.shape[0] == 2 and ro.valid[1].all()  # 3-step episodes end inside the 2nd decision
    assert len(ro.episodes) == 4


def _success_after(learner_cls, cfg, iters: int) -> tuple[float, float]:
    torch.manual_seed(0)
    env = _env(n=8, steps=4, goal=2.0)
    policy = GaussianPolicy(2, 1, horizon=2, init_mean=0.0)
    learner = learner_cls(cfg, policy)
    engine = RolloutEngine(env, policy, use_critic=learner.uses_critic)

    def act(obs):
        with torch.no_grad():
            return policy.act(obs, ActMode.EVAL).actions

    before = evaluate_episodes(_env(n=8, steps=4), act, 16, seed=999, progress=False).success_rate
    for it in range(iters):
        # PPO resets every env from seed 100 * it; GRPO plays groups from seeds 100 * it and 100 * it + 1
        learner.update(learner.collect(IterationInputs(iteration=it, seed_base=100 * it, reset=True, engine=engine)))
    after = evaluate_episodes(_env(n=8, steps=4), act, 16, seed=999, progress=False).success_rate
    return before, after


def test_ppo_learns_the_toy_task():
    cfg = PPOConfig(decisions_per_iter=2, epochs=4, minibatch_size=8, lr_actor=0.05, lr_critic=0.01)
    before, after = _success_after(PPOLearner, cfg, iters=15)
    assert before <= 0.25 and after >= 0.9, (before, after)


def test_grpo_learns_the_toy_task():
    cfg = GRPOConfig(decisions_per_iter=2, epochs=4, minibatch_size=8, lr_actor=0.05, group_size=4,
                     dynamic_sampling=False)
    before, after = _success_after(PPOLearner, cfg, iters=15)
    assert before <= 0.25 and after >= 0.9, (before, after)


def test_grpo_is_ppo_with_group_advantages():
    entry = ALGORITHMS.get("grpo")
    assert entry.obj is ALGORITHMS.get("ppo").obj is PPOLearner and entry.config is GRPOConfig
    assert GRPOConfig().type == "grpo" and PPOConfig().type == "ppo"
    assert GRPOConfig().advantage is AdvantageEstimator.GROUP and PPOConfig().advantage is AdvantageEstimator.GAE
    policy = GaussianPolicy(2, 1, horizon=2)
    grpo, ppo = PPOLearner(GRPOConfig(), policy), PPOLearner(PPOConfig(advantage="group"), policy)
    assert (grpo.needs, grpo.uses_critic) == (ppo.needs, ppo.uses_critic) == (Needs.GROUPS, False)
    assert [g["name"] for g in ppo.optimizer.param_groups] == ["actor"]  # no critic to train
    gae = PPOLearner(PPOConfig(), policy)
    assert (gae.needs, gae.uses_critic) == (Needs.ON_POLICY, True)
    assert [g["name"] for g in gae.optimizer.param_groups] == ["actor", "critic"]
    with pytest.raises(ValueError, match="algo.critic_warmup_iters"):
        GRPOConfig(critic_warmup_iters=1)
    with pytest.raises(ValueError, match="algo.group_size=3 must divide env.num_envs=4"):
        PPOConfig(advantage="group", group_size=3).check_run(4)
    PPOConfig(group_size=3).check_run(4)  # GAE plays no groups


def test_wilson_interval_values():
    lo, hi = wilson_interval(50, 100)
    assert abs(lo - 0.4038) < 1e-3 and abs(hi - 0.5962) < 1e-3
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0


def test_update_skips_when_dynamic_sampling_drops_every_group():
    env = _env(n=4, steps=3, goal=100.0)  # nobody succeeds: every group has success rate 0
    policy = GaussianPolicy(2, 1, horizon=2)
    learner = PPOLearner(GRPOConfig(group_size=2, decisions_per_iter=3), policy)
    engine = RolloutEngine(env, policy, use_critic=False)
    before = [p.detach().clone() for p in policy.parameters()]
    stats = learner.update(learner.collect(IterationInputs(iteration=0, seed_base=1, reset=True, engine=engine)))
    assert {k: v for k, v in stats.items() if not k.startswith("time/")} == {"update/skipped": 1.0}
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))


class _SharedTrunkPolicy(GaussianPolicy):
    """The Gaussian toy policy with a trunk shared by the action mean and the value head."""

    def __init__(self) -> None:
        super().__init__(2, 1, horizon=2)
        self.trunk = torch.nn.Linear(2, 2)
        self.value_head = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        self.mu = torch.nn.Linear(2, 2)

    def _dist(self, obs):
        return torch.distributions.Normal(self.mu(self.trunk(obs[OBS_STATE])), self.log_std.exp())

    def value(self, obs):
        return self.value_head(self.trunk(obs[OBS_STATE])).squeeze(-1)


@pytest.mark.parametrize("shared", [False, True])
def test_value_loss_reaches_the_shared_trunk_only_when_asked(shared):
    """``value_grad_to_actor=False`` (default): the actor's gradient is the policy loss's alone."""
    import copy

    torch.manual_seed(0)
    base = _SharedTrunkPolicy()
    engine = RolloutEngine(_env(n=4, steps=4, goal=0.3), base)
    engine.reset(seed=0)
    rollout = engine.collect(3)

    def trunk_grad(vf_coef: float) -> torch.Tensor:
        policy = copy.deepcopy(base)
        cfg = PPOConfig(epochs=1, minibatch_size=64, vf_coef=vf_coef, max_grad_norm=1e9, value_grad_to_actor=shared)
        learner = PPOLearner(cfg, policy)
        seen = []
        learner.optimizer.step = lambda: seen.append(policy.trunk.weight.grad.clone())
        torch.manual_seed(1)
        learner.update(rollout)
        return seen[0]

    with_value, without_value = trunk_grad(0.5), trunk_grad(0.0)
    assert float(without_value.abs().sum()) > 0
    assert torch.allclose(with_value, without_value) != shared
