"""Success-filtered self-imitation: the success buffer's bookkeeping and the learner learning a bandit."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from policies.base import ActMode
from policies.compact import CompactFlowConfig, CompactFlowPolicy, TextEncoderKind
from policies.flow.sampler import InitialNoise, SamplerConfig, SamplerKind, SdeMode
from sim.core import OBS_STATE
from sim.vector import SerialVecEnv
from tests.sim.toy_env import CounterEnv
from tests.vla_rl.toy_policy import GaussianPolicy
from vla_core.manifest import IntegrityError
from vla_rl.algorithms.base import IterationInputs
from vla_rl.algorithms.filtered_bc import FilteredBCConfig, FilteredBCLearner
from vla_rl.data.replay import SuccessBuffer
from vla_rl.rollout import RolloutEngine

torch.set_num_threads(1)


def _engine(goal: float, n: int, policy, episode_steps: int = 4) -> RolloutEngine:
    env = SerialVecEnv([functools.partial(CounterEnv, episode_steps=episode_steps, goal=goal) for _ in range(n)],
                       "toy/counter")
    return RolloutEngine(env, policy)


def test_the_buffer_keeps_exactly_the_decisions_of_successful_episodes_across_rollouts() -> None:
    """Episodes run across two rollouts (3 + 5 decisions of one step each); the buffer holds every decision of
    each episode that succeeded, none of a failed one, and waits for episodes still running."""
    torch.manual_seed(0)
    engine = _engine(goal=0.6, n=4, policy=GaussianPolicy(2, 1, horizon=1, init_mean=0.2))
    engine.reset(seed=0)
    buffer = SuccessBuffer(capacity=1000)
    first = engine.collect(3, ActMode.EXPLORE)
    buffer.add_rollout(first)
    second = engine.collect(5, ActMode.EXPLORE)
    buffer.add_rollout(second)
    episodes = first.episodes + second.episodes
    won, lost = [e for e in episodes if e.success], [e for e in episodes if not e.success]
    assert won and lost  # both outcomes happen: the test can tell them apart
    assert buffer.episodes_kept == len(won) and buffer.episodes_dropped == len(lost)
    assert len(buffer) == sum(e.length for e in won)  # one step per decision
    rows = buffer.sample(len(buffer) * 50, torch.Generator().manual_seed(0))
    assert rows.actions.shape == (len(buffer) * 50, 1, 1) and bool(rows.mask.all())
    # CounterEnv's state is [position, step in episode]: each kept episode brings its first decision (step 0)
    kept_steps = rows.obs[OBS_STATE][:, 1].unique()
    assert 0.0 in kept_steps.tolist() and float(kept_steps.max()) < 4


def test_the_buffer_can_judge_success_by_the_runs_reward_instead_of_the_env() -> None:
    """``success_return``: an episode is kept when its summed reward (the configured terms, here the env's
    ``progress`` term, the position reached) reaches the threshold, whatever the env's success flag says; with
    ``{success: 1.0}`` and threshold 1 the two judges agree episode for episode."""
    from rewards import RewardConfig

    def rollout(terms: dict[str, float]):
        torch.manual_seed(0)
        policy = GaussianPolicy(2, 1, horizon=1, init_mean=0.3)
        env = SerialVecEnv([functools.partial(CounterEnv, episode_steps=1, goal=0.6, extra_term="progress")
                            for _ in range(16)], "toy/counter")
        engine = RolloutEngine(env, policy, reward=RewardConfig(terms=terms))
        engine.reset(seed=0)
        return engine.collect(4, ActMode.EXPLORE)  # one-step episodes: each decision is a whole episode

    by_reward = rollout({"progress": 1.0})
    buffer = SuccessBuffer(capacity=1000, success_return=0.4)
    buffer.add_rollout(by_reward)
    kept = int((by_reward.rewards >= 0.4).sum())
    env_successes = sum(e.success for e in by_reward.episodes)
    assert kept != env_successes and 0 < kept < by_reward.rewards.numel()  # the judges differ on this data
    assert buffer.episodes_kept == kept and len(buffer) == kept
    assert buffer.episodes_dropped == by_reward.rewards.numel() - kept

    by_success = rollout({"success": 1.0})
    same = SuccessBuffer(capacity=1000, success_return=1.0)
    same.add_rollout(by_success)
    env_judged = SuccessBuffer(capacity=1000)
    env_judged.add_rollout(by_success)
    assert same.episodes_kept == env_judged.episodes_kept == sum(e.success for e in by_success.episodes) > 0
    with pytest.raises(ValueError, match="success_return"):
        FilteredBCConfig(success_return=-1.0)


def test_the_buffer_is_a_ring_filters_keys_and_names_what_it_lacks() -> None:
    torch.manual_seed(0)
    engine = _engine(goal=0.05, n=4, policy=GaussianPolicy(2, 1, horizon=1, init_mean=0.5), episode_steps=2)
    engine.reset(seed=0)
    ring = SuccessBuffer(capacity=5, keys=[OBS_STATE, "task"])
    ring.add_rollout(engine.collect(6, ActMode.EXPLORE))
    assert ring.episodes_kept > 5 and len(ring) == 5
    assert list(ring.sample(3, torch.Generator()).obs) == [OBS_STATE, "task"]
    with pytest.raises(KeyError, match="observation.images.missing"):
        SuccessBuffer(5, keys=["observation.images.missing"]).add_rollout(engine.collect(1, ActMode.EXPLORE))
    with pytest.raises(ValueError, match="empty"):
        SuccessBuffer(5).sample(1, torch.Generator())
    with pytest.raises(ValueError, match="capacity"):
        SuccessBuffer(0)


def _rows(buffer: SuccessBuffer) -> list[tuple]:
    """Every kept row as (task, state, action), in ring order: what ``sample`` draws from, position by position."""
    assert buffer._actions is not None
    return [(buffer._obs["task"][i], *buffer._obs[OBS_STATE][i].tolist(), *buffer._actions[i].flatten().tolist())
            for i in range(len(buffer))]


def test_the_buffer_saves_to_an_append_only_store_and_a_resumed_buffer_holds_the_same_rows(tmp_path) -> None:
    """Each state writes only the rows added since the last one; a buffer loaded from any of the last ``keep``
    states holds exactly the rows (ring positions included) and draws the same minibatches; older shards are
    deleted, shards written after the state a run resumes from are dropped, and a lost store is named."""
    torch.manual_seed(0)
    engine = _engine(goal=0.05, n=4, policy=GaussianPolicy(2, 1, horizon=1, init_mean=0.5), episode_steps=2)
    engine.reset(seed=0)
    store = tmp_path / "store"
    store.mkdir()
    (store / "rows_000000000000_000000000003.pt.zlib").write_bytes(b"from a start that never checkpointed")
    buffer = SuccessBuffer(capacity=7, keys=[OBS_STATE, "task"])
    buffer.persist(store, keep=2)
    saved = []
    for _ in range(5):
        buffer.add_rollout(engine.collect(2, ActMode.EXPLORE))
        saved.append((buffer.state_dict(), _rows(buffer), buffer.sample(9, torch.Generator().manual_seed(1))))
    assert buffer.rows_added > 3 * buffer.capacity  # the ring wrapped several times
    shards = sorted(p.name for p in store.iterdir())
    assert len(shards) <= 3 and "rows_000000000000_000000000003.pt.zlib" not in shards  # pruned, stale one gone
    (store / ".rows_000000000099_000000000100.pt.tmp1").write_bytes(b"killed mid-write")

    for state, rows, batch in (saved[-1], saved[-2]):  # the last keep=2 states stay loadable
        resumed = SuccessBuffer(capacity=7, keys=[OBS_STATE, "task"])
        resumed.persist(store, keep=2)
        resumed.load_state_dict(state)
        assert len(resumed) == len(rows) and _rows(resumed) == rows
        again = resumed.sample(9, torch.Generator().manual_seed(1))
        assert torch.equal(again.actions, batch.actions) and again.obs["task"] == batch.obs["task"]
        assert (resumed.episodes_kept, resumed.rows_added) == (state["episodes"][0], state["rows_added"])
    assert not list(store.glob(".rows_*"))  # the leftover temporary file was removed
    # resuming the older state dropped the shard written after it: the resumed run writes its own
    assert max(int(p.name.split("_")[2].split(".")[0]) for p in store.glob("rows_*")) == saved[-2][0]["rows_added"]

    with pytest.raises(ValueError, match="algo.buffer_size"):
        other = SuccessBuffer(capacity=8)
        other.persist(store)
        other.load_state_dict(saved[-2][0])
    newest = max(store.glob("rows_*"))
    newest.write_bytes(newest.read_bytes()[:100])
    with pytest.raises(IntegrityError, match=newest.name):
        damaged = SuccessBuffer(capacity=7, keys=[OBS_STATE, "task"])
        damaged.persist(store)
        damaged.load_state_dict(saved[-2][0])
    for shard in store.glob("rows_*"):
        shard.unlink()
    lost = SuccessBuffer(capacity=7)
    lost.persist(store)
    with pytest.raises(FileNotFoundError, match=f"not in its store {store}"):
        lost.load_state_dict(saved[-2][0])
    with pytest.raises(ValueError, match="persist"):
        SuccessBuffer(capacity=7).state_dict()


def test_a_resumed_filtered_bc_run_keeps_imitating_the_successes_it_had_collected(tmp_path, capsys) -> None:
    """``vla-rl train --algo.type filtered_bc`` stopped after 3 iterations and resumed: the buffer comes back with
    the decisions it held and grows from there (it used to restart empty). The episodes a run keeps are judged
    by ``success_return`` on the negated env reward, so a random tiny policy fills the buffer."""
    from vla_rl.cli import run

    args = ["train", "--env.id", "mujoco/pick-red", "--env.num_envs", "2", "--env.image_size", "32",
            "--env.max_episode_steps", "16", "--policy.type", "compact-flow", "--policy.width", "32",
            "--policy.heads", "2", "--policy.chunk_size", "4", "--policy.text_encoder", "hashed",
            "--policy.cnn_channels", "[8,16]", "--policy.image_tokens", "2", "--policy.sampler.num_steps", "2",
            "--eval.episodes", "2", "--eval.every", "0", "--eval.video", "false", "--logging.wandb", "false",
            "--logging.tensorboard", "false", "--algo.type", "filtered_bc", "--algo.decisions_per_iter", "4",
            "--algo.steps_per_iter", "1", "--algo.batch_size", "4", "--algo.min_buffer", "1",
            "--algo.success_return", "0.000001", "--reward.terms", "{env: -1.0}", "--run_dir", str(tmp_path / "run")]

    def kept() -> list[float]:
        rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        return [r["update/buffer_decisions"] for r in rows if "update/buffer_decisions" in r]

    run([*args, "--iterations", "3"])
    before = kept()
    assert before[-1] > 0 and len(before) == 3
    capsys.readouterr()
    run([*args, "--iterations", "5", "--resume", "true"])
    out = capsys.readouterr().out
    assert f"success buffer: {before[-1]:.0f} decisions" in out and "restored from" in out
    after = kept()[3:]
    assert len(after) == 2 and after[0] > before[-1] and after[1] > after[0]  # it grows on from the saved rows
    assert list((tmp_path / "run" / "learner_store").glob("rows_*.pt.zlib"))


def _flow_policy(seed: int) -> CompactFlowPolicy:
    torch.manual_seed(seed)
    return CompactFlowPolicy(CompactFlowConfig(
        cameras=(), state_dim=2, action_dim=1, chunk_size=1, width=16, heads=2, expert_layers=1,
        text_encoder=TextEncoderKind.HASHED, text_buckets=16, value_hidden=16,
        sampler=SamplerConfig(kind=SamplerKind.FLOW_SDE, sde_mode=SdeMode.FULL_CHAIN, num_steps=2,
                              explore_noise=InitialNoise.RANDOM),
    ))


def _success(policy: CompactFlowPolicy, goal: float) -> float:
    from vla_rl.evaluation import evaluate_episodes

    def act(obs):
        with torch.no_grad():
            return policy.act(obs, ActMode.EVAL).actions

    env = SerialVecEnv([functools.partial(CounterEnv, episode_steps=1, goal=goal) for _ in range(16)], "toy/counter")
    return evaluate_episodes(env, act, 64, seed=999, progress=False).success_rate


@pytest.mark.parametrize("seed", [0, 3])
def test_imitating_its_own_successes_lifts_a_flow_policy_on_a_bandit(seed: int) -> None:
    """Success is ``position + action >= 0.5`` in one step. A random flow policy's deterministic action misses;
    its samples sometimes hit. Imitating the hits (no demos, no critic) must make the deployed policy hit."""
    goal = 0.5
    policy = _flow_policy(seed)
    before = _success(policy, goal)
    cfg = FilteredBCConfig(lr=3e-3, steps=200, batch_size=32, steps_per_iter=10, decisions_per_iter=1,
                           min_buffer=8, image_shift=0)
    learner = FilteredBCLearner(cfg, policy)
    engine = _engine(goal, 32, policy, episode_steps=1)
    for it in range(12):
        learner.update(learner.collect(IterationInputs(iteration=it, seed_base=100 * it, reset=True, engine=engine)))
    after = _success(policy, goal)
    assert learner.buffer is not None and learner.buffer.episodes_kept > 0
    assert before <= 0.5 and after >= before + 0.4, (before, after)


def _bandit_run(seed: int, overlap: bool, iterations: int = 12) -> tuple[CompactFlowPolicy, FilteredBCLearner, int]:
    """The bandit loop of the test above (with ``overlap`` only the last iteration asks for a synced policy); also
    returns how many minibatches the collections drew."""
    policy = _flow_policy(seed)
    cfg = FilteredBCConfig(lr=3e-3, steps=200, batch_size=32, steps_per_iter=10, decisions_per_iter=1,
                           min_buffer=8, image_shift=0, overlap=overlap)
    learner = FilteredBCLearner(cfg, policy)
    engine = _engine(0.5, 32, policy, episode_steps=1)
    drawn = 0
    for it in range(iterations):
        inputs = IterationInputs(iteration=it, seed_base=100 * it, reset=True, engine=engine,
                                 sync=it == iterations - 1)
        rollout = learner.collect(inputs)
        drawn += len(learner._batches)
        learner.update(rollout)
    return policy, learner, drawn


@pytest.mark.parametrize("seed", [0, 3])
def test_overlapped_updates_learn_the_bandit_too_and_reproduce_exactly(seed: int) -> None:
    """With ``overlap`` the gradient steps of iteration i run in a thread while iteration i+1 collects with the
    weights from before them. Learning still lifts the policy, every drawn minibatch is trained on by the end, and
    two runs give the same weights bit for bit: the actor draws from its own generator, so the threads' timing
    never reorders anyone's random numbers."""
    before = _success(_flow_policy(seed), 0.5)
    policy, learner, drawn = _bandit_run(seed, overlap=True)
    again, _, _ = _bandit_run(seed, overlap=True)
    assert learner.updater is not None and not learner._deferred and learner.updater.steps == drawn > 0
    plain, _, _ = _bandit_run(seed, overlap=False)
    for p, q in zip(policy.parameters(), again.parameters(), strict=True):
        assert torch.equal(p, q)
    assert any(not torch.equal(p, q) for p, q in zip(policy.parameters(), plain.parameters(), strict=True))
    after = _success(policy, 0.5)
    assert before <= 0.5 and after >= before + 0.4, (before, after)


def test_a_frozen_encoder_leaves_the_instruction_embedding_and_trains_the_expert() -> None:
    """``freeze_encoder``: the gradient steps change the action expert and leave every encoder parameter (here the
    instruction embedding) bit for bit, which the optimizer never holds; the bandit is still learned, since the
    expert reads the state directly."""
    policy = _flow_policy(0)
    encoder = {id(p) for p in policy.encoder_parameters()}
    assert encoder
    start = {n: p.detach().clone() for n, p in policy.named_parameters()}
    before = _success(policy, 0.5)
    cfg = FilteredBCConfig(lr=3e-3, steps=200, batch_size=32, steps_per_iter=10, decisions_per_iter=1,
                           min_buffer=8, image_shift=0, freeze_encoder=True)
    learner = FilteredBCLearner(cfg, policy)
    engine = _engine(0.5, 32, policy, episode_steps=1)
    for it in range(12):
        learner.update(learner.collect(IterationInputs(iteration=it, seed_base=100 * it, reset=True, engine=engine)))
    assert learner.updater is not None and learner.updater.steps > 0
    assert not encoder & {id(p) for g in learner.updater.optimizer.param_groups for p in g["params"]}
    changed = {n for n, p in policy.named_parameters() if not torch.equal(p, start[n])}
    assert any(n.startswith("expert.") for n in changed), changed
    assert not any(n.startswith(("prefix.", "hashed_text.")) for n in changed), changed
    after = _success(policy, 0.5)
    assert before <= 0.5 and after >= before + 0.4, (before, after)


def test_an_overlapped_collection_acts_with_the_weights_from_before_the_steps_it_trains() -> None:
    """Iteration 0 defers its steps (sync False); iteration 1's collection trains them in the background while a
    copy holding the pre-step weights acts; the engine gets the live policy back afterwards, a checkpoint taken
    between holds the state before the deferred steps, a synced update trains at once, and the env was asked
    once to lower its workers' priority."""
    policy = _flow_policy(0)
    cfg = FilteredBCConfig(lr=3e-3, steps=50, batch_size=16, steps_per_iter=3, decisions_per_iter=1, min_buffer=1,
                           image_shift=0, overlap=True)
    learner = FilteredBCLearner(cfg, policy)
    engine = _engine(0.5, 32, policy, episode_steps=1)
    seen: list[tuple[object, list[torch.Tensor]]] = []

    class Spy(type(engine)):  # type: ignore[misc]
        def collect(self, num_decisions, mode=ActMode.EXPLORE):
            seen.append((self.policy, [p.detach().clone() for p in self.policy.parameters()]))
            return super().collect(num_decisions, mode)

    engine.__class__ = Spy
    reniced: list[int] = []
    engine.env.lower_worker_priority = lambda nice: reniced.append(nice) or 0  # type: ignore[method-assign]
    learner.update(learner.collect(IterationInputs(iteration=0, seed_base=0, reset=True, engine=engine, sync=False)))
    assert learner.updater is not None and learner.updater.steps == 0 and len(learner._deferred) == 3
    assert learner.state_dict()["sft"]["steps"] == 0  # a checkpoint now holds the weights before the deferred steps
    start = [p.detach().clone() for p in policy.parameters()]
    rollout = learner.collect(IterationInputs(iteration=1, seed_base=100, reset=True, engine=engine, sync=True))
    actor, acted_with = seen[1]
    assert actor is not policy and engine.policy is policy and engine.generator is learner.act_generator
    assert all(torch.equal(a, s) for a, s in zip(acted_with, start, strict=True))
    assert learner.updater.steps == 3 and any(not torch.equal(p, s) for p, s in zip(policy.parameters(), start,
                                                                                      strict=True))
    stats = learner.update(rollout)  # synced: this iteration's own 3 steps run now
    assert learner.updater.steps == 6 and stats["update/steps"] == 6 and stats["update/overlapped_s"] > 0
    assert not learner._deferred and "act_generator" in learner.state_dict()
    assert reniced == [cfg.overlap_worker_nice]  # the env's workers yield to the update thread, asked once


def test_hindsight_relabels_failed_episodes_with_the_task_they_accomplished() -> None:
    """On the two-goal bandit a wide Gaussian policy often goes the wrong way far enough to accomplish the other
    task. Without relabeling those episodes are dropped; with it they are kept under the other instruction, so
    every kept row's instruction agrees with where its action went, and a learner asks the env for instructions."""
    from tests.sim.toy_env import TwoGoalEnv

    def collect(relabel):
        torch.manual_seed(0)
        env = SerialVecEnv([TwoGoalEnv for _ in range(32)], "toy/two-goal")
        engine = RolloutEngine(env, GaussianPolicy(2, 1, horizon=1, init_mean=0.0))
        engine.reset(seed=0)
        buffer = SuccessBuffer(capacity=1000, relabel=relabel)
        buffer.add_rollout(engine.collect(4, ActMode.EXPLORE))
        return buffer

    plain, hindsight = collect(None), collect(TwoGoalEnv.INSTRUCTIONS)
    assert plain.episodes_relabeled == 0 and hindsight.episodes_relabeled > 5
    assert hindsight.episodes_kept == plain.episodes_kept + hindsight.episodes_relabeled
    assert hindsight.episodes_dropped == plain.episodes_dropped - hindsight.episodes_relabeled
    rows = hindsight.sample(500, torch.Generator().manual_seed(0))
    went = rows.obs[OBS_STATE][:, 0] + rows.actions[:, 0, 0]  # position after the step
    told_right = torch.tensor([t == "go right" for t in rows.obs["task"]])
    assert bool((went[told_right] >= 0.5).all()) and bool((went[~told_right] <= -0.5).all())
    assert 0 < int(told_right.sum()) < 500
    env = SerialVecEnv([TwoGoalEnv for _ in range(2)], "toy/two-goal")
    assert FilteredBCLearner._instructions(RolloutEngine(env, GaussianPolicy(2, 1, horizon=1))) == ("go left", "go right")
    counter = SerialVecEnv([CounterEnv], "toy/counter")
    with pytest.raises(Exception, match="toy/counter names no task instructions"):
        FilteredBCLearner._instructions(RolloutEngine(counter, GaussianPolicy(2, 1, horizon=1)))
    # a chunk's first accomplishing step decides (steps report 1 + index, 0 for none or a held step)
    from types import SimpleNamespace
    chunks = SimpleNamespace(valid=torch.ones(1, 3, dtype=torch.bool),
                             step_signals={"achieved_task": torch.tensor([[[0.0, 3.0, 2.0], [0.0, 0.0, 0.0],
                                                                          [1.0, 0.0, 0.0]]])})
    assert SuccessBuffer(10, relabel=("a", "b", "c"))._achieved(chunks).tolist() == [[2, -1, 0]]
    signal_free = SuccessBuffer(10, relabel=("a", "b"))
    with pytest.raises(KeyError, match="achieved_task"):
        signal_free.add_rollout(_engine(0.5, 2, GaussianPolicy(2, 1, horizon=1), episode_steps=1).collect(
            1, ActMode.EXPLORE))


def test_overlap_is_refused_under_several_processes_and_one_process_is_accepted() -> None:
    from types import SimpleNamespace

    from vla_rl.config import ConfigError
    from vla_rl.distributed import SINGLE

    learner = FilteredBCLearner(FilteredBCConfig(overlap=True, steps=10), GaussianPolicy(2, 1, horizon=1))
    learner.distribute(SINGLE)
    with pytest.raises(ConfigError, match="algo.overlap trains in a thread.*--algo.overlap false"):
        learner.distribute(SimpleNamespace(enabled=True))
