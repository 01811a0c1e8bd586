"""Learned rewards: labels, recording, fitting on tiny data, checkpoints, input checks and the learned terms."""

from __future__ import annotations

import dataclasses
import functools
import json

import numpy as np
import pytest
import torch

from policies.base import ActMode
from policies.io import CheckpointError
from rewards import RewardConfig, RewardFunction
from rewards.learned.data import record_episodes
from rewards.learned.labels import (
    Episode,
    event_boundaries,
    event_targets,
    milestone_targets,
    stage_targets,
    success_targets,
    task_state_from_obs,
)
from rewards.learned.model import RewardInputError, RewardModel, RewardModelConfig, load_reward_model
from rewards.learned.terms import ClassifierTermConfig, ProgressTermConfig
from rewards.learned.train import (
    FitConfig,
    classifier_metrics,
    fit_reward_model,
    instruction_swaps,
    progress_metrics,
    split_episodes,
)
from sim.core import OBS_ENV_STATE, OBS_STATE, TASK, ChunkSteps, image_key
from sim.mujoco_tasks.tasks import TASK_INDEX, TASKS, stage_progress
from sim.tasks import TASK_INDEX as TASK_INDEX_KEY
from sim.vector import SerialVecEnv
from tests.sim.toy_env import CounterEnv
from tests.vla_rl.toy_policy import GaussianPolicy
from vla_rl.rollout import RolloutEngine, reward_scalars
from vla_rl.trainer import rollout_scalars

CAM = image_key("cam")


def _env_state(task: str, red: tuple[float, float, float], pad: tuple[float, float] = (0.5, 0.1)) -> np.ndarray:
    cubes = [red, (0.45, -0.1, 0.02), (0.55, 0.15, 0.02)]
    return np.array([*np.ravel(cubes), pad[0], pad[1], 0.0, TASK_INDEX[task]], np.float32)


@pytest.mark.parametrize("pinch, opening, red, stages", [
    ((0.3, 0.0, 0.2), 1.0, (0.5, 0.0, 0.02), 0),     # far away
    ((0.5, 0.0, 0.03), 1.0, (0.5, 0.0, 0.02), 1),    # reached, gripper open
    ((0.5, 0.0, 0.025), 0.34, (0.5, 0.0, 0.02), 2),  # closed on the cube
    ((0.5, 0.0, 0.055), 0.34, (0.5, 0.0, 0.05), 3),  # lifted 3 cm while held
    ((0.5, 0.0, 0.025), 0.0, (0.5, 0.0, 0.02), 1),   # closed on nothing (opening 0): not grasped
])
def test_stage_rule_rebuilds_the_pick_stages_from_privileged_observations(pinch, opening, red, stages):
    state = np.array([*pinch, opening, *np.zeros(7)], np.float32)
    task = TASKS[TASK_INDEX["pick-red"]]
    assert stage_progress(task, task_state_from_obs(state, _env_state("pick-red", red))) == stages


def test_stage_targets_are_stage_fractions_and_one_on_success_frames():
    frames = [((0.3, 0.0, 0.2), 1.0, (0.5, 0.0, 0.02)), ((0.5, 0.0, 0.025), 0.34, (0.5, 0.0, 0.02)),
              ((0.5, 0.0, 0.1), 0.34, (0.5, 0.0, 0.1))]
    state = torch.tensor(np.stack([[*p, o, *np.zeros(7)] for p, o, _ in frames]), dtype=torch.float32)
    env_state = torch.tensor(np.stack([_env_state("pick-red", r) for _, _, r in frames]))
    ep = Episode(obs={OBS_STATE: state, OBS_ENV_STATE: env_state}, success=torch.tensor([False, False, True]), task="x")
    assert stage_targets(ep).tolist() == [0.0, 0.5, 1.0]  # pick has 3 stages: k / 4
    with pytest.raises(ValueError, match="events"):
        stage_targets(Episode(obs={OBS_STATE: state}, success=ep.success, task="x"))


def test_an_instruction_swap_relabels_the_stages_for_the_new_task():
    frames = [((0.5, 0.0, 0.025), 0.34, (0.5, 0.0, 0.02)), ((0.5, 0.0, 0.1), 0.34, (0.5, 0.0, 0.1))]
    state = torch.tensor(np.stack([[*p, o, *np.zeros(7)] for p, o, _ in frames]), dtype=torch.float32)
    red = Episode(obs={OBS_STATE: state, OBS_ENV_STATE: torch.tensor(np.stack([_env_state("pick-red", r)
                                                                               for _, _, r in frames])),
                       TASK_INDEX_KEY: torch.full((2,), TASK_INDEX["pick-red"])},
                  success=torch.tensor([False, True]), task="pick up the red cube")
    blue = Episode(obs={OBS_STATE: state[:1], OBS_ENV_STATE: torch.tensor(_env_state("pick-blue", (0.3, 0.2, 0.02)))[None],
                        TASK_INDEX_KEY: torch.full((1,), TASK_INDEX["pick-blue"])},
                   success=torch.tensor([False]), task="pick up the blue cube")
    # the red cube grasped, then lifted (a success) ...
    assert stage_targets(red).tolist() == [0.5, 1.0]
    swaps = instruction_swaps([red, blue], seed=0, successes_only=False)
    assert [e.task for e in swaps] == ["pick up the blue cube", "pick up the red cube"]
    # ... is no progress at all at picking the blue one, which the arm never reached
    assert stage_targets(swaps[0]).tolist() == [0.0, 0.0]
    assert swaps[0].obs[TASK_INDEX_KEY].tolist() == [TASK_INDEX["pick-blue"]] * 2
    assert swaps[0].obs[OBS_STATE] is red.obs[OBS_STATE] and red.obs[OBS_ENV_STATE][0, -1] == TASK_INDEX["pick-red"]
    only = instruction_swaps([red, blue], seed=0)  # a classifier's swaps: the successes only
    assert [(e.task, e.obs[OBS_STATE] is red.obs[OBS_STATE]) for e in only] == [("pick up the blue cube", True)]
    with pytest.raises(ValueError, match="--labels stages"):
        fit_reward_model("progress", [red, blue], [stage_targets(red), stage_targets(blue)],
                         FitConfig(epochs=1, width=4, holdout=0.0, counterfactual=True))


def test_event_boundaries_at_gripper_changes_and_rests():
    # ee moves 1 cm/frame for 4 frames, rests 2 frames, moves again; gripper closes at frame 5, opens at 8
    x = [0.0, 0.01, 0.02, 0.03, 0.04, 0.04, 0.04, 0.05, 0.06, 0.07]
    grip = [1, 1, 1, 1, 1, 0.3, 0.3, 0.3, 1, 1]
    state = torch.tensor([[xi, 0.0, 0.0, g] for xi, g in zip(x, grip)])
    bounds = event_boundaries(state)
    assert bounds.nonzero().flatten().tolist() == [5, 8]  # rest starts at 5 (after 4 moving frames) = the close
    ep = Episode(obs={OBS_STATE: state}, success=torch.tensor([False] * 9 + [True]), task="x")
    prog = event_targets(ep)
    assert prog[:5].tolist() == [0.0] * 5 and prog[5:8].tolist() == [pytest.approx(1 / 3)] * 3
    assert prog[8] == pytest.approx(2 / 3) and prog[9] == 1.0
    failed = Episode(obs={OBS_STATE: state}, success=torch.zeros(10, dtype=torch.bool), task="x")
    kept, targets = milestone_targets([ep, failed], "events")  # events label successful episodes only
    assert kept == [ep] and len(targets) == 1


def _counter_env(n: int = 4, goal: float = 0.6, steps: int = 6) -> SerialVecEnv:
    factories = [functools.partial(CounterEnv, episode_steps=steps, goal=goal) for _ in range(n)]
    return SerialVecEnv(factories, "toy/counter")


def _counter_episodes(n: int, seed: int = 0) -> list[Episode]:
    gen = torch.Generator().manual_seed(seed)
    env = _counter_env()
    try:  # half the envs push towards the goal, half stand still: successes and failures
        return record_episodes(env, lambda obs: (torch.rand(4, 2, 1, generator=gen) * 0.4)
                               * torch.tensor([1.0, 0.0, 1.0, 0.0])[:, None, None], n, seed)
    finally:
        env.close()


def test_recorded_episodes_label_the_state_each_frame_shows():
    eps = _counter_episodes(8)
    assert len(eps) == 8 and any(e.succeeded for e in eps) and not all(e.succeeded for e in eps)
    for e in eps:
        pos = e.obs[OBS_STATE][:, 0]
        assert torch.equal(e.success, pos >= 0.6 - 1e-6), (pos, e.success)  # the flag of the state shown
        assert e.obs[CAM].dtype == torch.uint8 and e.obs[CAM].shape[1:] == (4, 4, 3)
        assert success_targets(e).dtype == torch.float32


def test_classifier_learns_success_on_tiny_data_and_reports_held_out_precision_recall():
    torch.manual_seed(0)
    eps = _counter_episodes(100)
    cfg = FitConfig(epochs=60, batch_size=64, lr=3e-3, width=8, holdout=0.25, seed=0)
    model, train_idx, held_idx = fit_reward_model("classifier", eps, [success_targets(e) for e in eps], cfg)
    assert len(held_idx) == 25 and not set(train_idx) & set(held_idx)
    m = classifier_metrics(model, [eps[i] for i in held_idx])
    assert m["episodes"] == 25 and m["positive_frames"] > 0
    assert m["precision"] >= 0.9 and m["recall"] >= 0.9 and m["episode_accuracy"] >= 0.9, m


class _FixedClassifier:
    """Stands in for a RewardModel: returns preset per-frame probabilities."""

    reads_instruction = False

    def __init__(self, probs: list[float]) -> None:
        self.config = RewardModelConfig(kind="classifier", inputs={CAM: [1, 1, 3]})
        self.probs = torch.tensor(probs)

    def predict(self, obs, where=""):
        assert obs[CAM].shape[0] == len(self.probs)
        return self.probs


def test_first_verdict_accuracy_counts_failures_the_classifier_fires_on_anywhere():
    def ep(flags):
        return Episode(obs={CAM: torch.zeros(len(flags), 1, 1, 3, dtype=torch.uint8)},
                       success=torch.tensor(flags), task="x")

    eps = [ep([False, False, True]), ep([False, False, False]), ep([False, False, False]), ep([False, True])]
    # ep 0: right on its last frame; ep 1: fires mid-episode (a failure ended as success); ep 2: silent;
    # ep 3: a success missed on its last frame but called one step early
    probs = [0.1, 0.2, 0.9, 0.1, 0.8, 0.3, 0.0, 0.1, 0.2, 0.7, 0.4]
    m = classifier_metrics(_FixedClassifier(probs), eps)
    assert m["episode_accuracy"] == 0.75  # last frames: ep 3 wrong
    assert m["first_verdict_accuracy"] == 0.75 and m["failures_called_success"] == 1  # any frame: ep 1 wrong


def test_progress_metrics_report_what_the_milestone_form_would_overpay():
    def ep(flags):
        return Episode(obs={CAM: torch.zeros(len(flags), 1, 1, 3, dtype=torch.uint8)},
                       success=torch.tensor(flags), task="x")

    eps = [ep([False, True]), ep([False, False, False])]  # a success, a failure
    targets = [torch.tensor([0.5, 1.0]), torch.tensor([0.0, 0.25, 0.25])]
    m = progress_metrics(_FixedClassifier([0.5, 0.9, 0.0, 0.75, 0.5]), eps, targets)  # preset per-frame values
    # episode maxima: predicted 0.9 and 0.75 against labelled 1.0 and 0.25
    assert m["max_excess"] == pytest.approx((-0.1 + 0.5) / 2) and m["max_excess_failed"] == pytest.approx(0.5)
    assert "max_excess_failed" not in progress_metrics(_FixedClassifier([0.5, 0.9]), eps[:1], targets[:1])


def test_progress_model_learns_a_progress_label_on_tiny_data():
    torch.manual_seed(0)
    eps = _counter_episodes(100)
    targets = [(e.obs[OBS_STATE][:, 0] / 0.6).clamp(0, 1) for e in eps]  # progress = position towards the goal
    model, _, held = fit_reward_model("progress", eps, targets, FitConfig(epochs=60, width=8, lr=3e-3, seed=0))
    m = progress_metrics(model, [eps[i] for i in held], [targets[i] for i in held])
    untrained = progress_metrics(RewardModel(model.config), [eps[i] for i in held], [targets[i] for i in held])
    assert m["spearman"] >= 0.85 and m["mae"] <= 0.06 and untrained["mae"] >= 0.25, (m, untrained)


def test_classifier_needs_both_outcomes():
    eps = [e for e in _counter_episodes(8) if not e.succeeded]
    with pytest.raises(ValueError, match="no success frames"):
        fit_reward_model("classifier", eps, [success_targets(e) for e in eps], FitConfig(epochs=1))


def test_split_is_by_episode_and_seeded():
    a, b = split_episodes(10, 0.2, 3)
    assert (a, b) == split_episodes(10, 0.2, 3) and len(b) == 2 and sorted(a + b) == list(range(10))
    assert split_episodes(1, 0.5, 0) == ([0], [])


def _switch_model(kind: str = "classifier") -> RewardModel:
    """A state-only model with P = sigmoid(20 * relu(state[0]) - 10): ~1 where state[0] = 1, ~0 where 0."""
    model = RewardModel(RewardModelConfig(kind=kind, inputs={OBS_STATE: [2]}, width=2))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.state_net[0].weight[0, 0] = 1.0
        model.head[0].weight[0, 0] = 1.0
        model.head[2].weight[0, 0] = 20.0
        model.head[2].bias[0] = -10.0
    return model


def test_checkpoint_round_trip_manifest_and_damage(tmp_path):
    model = _switch_model()
    path = model.save(tmp_path / "clf")
    assert (path / "manifest.json").is_file()
    assert json.loads((path / "config.json").read_text())["type"] == "reward_model"
    obs = {OBS_STATE: torch.tensor([[1.0, 0.0], [0.0, 5.0]])}
    assert torch.equal(load_reward_model(path).predict(obs), model.predict(obs))
    weights = path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_reward_model(path)
    with pytest.raises(CheckpointError, match="no such reward model folder"):
        load_reward_model(tmp_path / "missing")


def test_inputs_that_do_not_match_name_the_key_and_both_shapes():
    model = RewardModel(RewardModelConfig(inputs={CAM: [8, 8, 3], OBS_STATE: [2]}, width=4))
    with pytest.raises(RewardInputError) as err:
        model.check_inputs({CAM: (4, 4, 3), OBS_STATE: (2,)}, where="toy/counter")
    assert all(w in str(err.value) for w in ("toy/counter", CAM, "[4, 4, 3]", "[8, 8, 3]"))
    with pytest.raises(RewardInputError, match="has no 'observation.state'"):
        model.predict({CAM: torch.zeros(1, 8, 8, 3, dtype=torch.uint8)})


def _instructed_episodes(n: int, seed: int = 0) -> list[Episode]:
    """Episodes whose success depends on the instruction: ``go right`` succeeds at x >= 0.5, ``go left`` at
    x <= -0.5; both instructions walk both ways, so the state alone says "at an end", not "at the named one"."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        task = "Go RIGHT" if i % 2 else "go left"
        direction = 1.0 if (i // 2) % 2 else -1.0
        x = direction * torch.linspace(0, 0.8, 5) + 0.02 * torch.randn(5, generator=gen)
        goal = (x >= 0.5) if "right" in task.lower() else (x <= -0.5)
        state = torch.stack([x, torch.zeros(5)], 1)
        out.append(Episode(obs={OBS_STATE: state}, success=goal, task=task))
    return out


def test_classifier_reads_the_instruction_when_success_depends_on_it(tmp_path):
    eps = _instructed_episodes(120)
    targets = [success_targets(e) for e in eps]
    fit = functools.partial(FitConfig, epochs=40, batch_size=32, lr=3e-3, width=8, holdout=0.25, seed=0)
    model, _, held = fit_reward_model("classifier", eps, targets, fit())
    blind, _, _ = fit_reward_model("classifier", eps, targets, fit(instruction="no"))
    assert model.config.vocabulary == ["go", "left", "right"] and blind.config.vocabulary == []
    held_eps = [eps[i] for i in held]
    m, b = classifier_metrics(model, held_eps), classifier_metrics(blind, held_eps)
    assert m["episode_accuracy"] >= 0.95 and b["episode_accuracy"] <= 0.75, (m, b)
    # the same state, the two instructions: only the named end is a success
    obs = {OBS_STATE: torch.tensor([[0.8, 0.0], [0.8, 0.0]]), TASK: ["go right", "go left"]}
    p = model.predict(obs)
    assert p[0] > 0.5 > p[1]
    loaded = load_reward_model(model.save(tmp_path / "clf"))
    assert loaded.config.vocabulary == model.config.vocabulary and torch.equal(loaded.predict(obs), p)
    # unknown words are ignored; a batch without the instruction is refused, naming it
    assert model.instruction_ids(["please GO right, now"]).tolist() == [[0, 1, 3, 0]]
    with pytest.raises(RewardInputError, match="has no 'task'"):
        model.predict({OBS_STATE: obs[OBS_STATE]})


def _two_cube_episodes(n: int, seed: int = 0) -> list[Episode]:
    """8 px images with a red and a blue square, each up (top rows) or down; ``lift the red cube`` succeeds on
    the frames where the red one is up, ``lift the blue cube`` where the blue one is: which colour is up has
    to be read from the pixels and bound to the instruction's colour word."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        colour = "red" if i % 2 else "blue"
        frames, flags = [], []
        for _ in range(4):
            img = torch.zeros(8, 8, 3, dtype=torch.uint8)
            up = torch.rand(2, generator=gen) < 0.5
            for channel, (is_up, col) in enumerate(zip(up.tolist(), (1, 5))):
                row = 1 if is_up else 5
                img[row:row + 2, col:col + 2, 0 if channel == 0 else 2] = 255
            frames.append(img)
            flags.append(bool(up[0] if colour == "red" else up[1]))
        out.append(Episode(obs={CAM: torch.stack(frames)}, success=torch.tensor(flags),
                           task=f"lift the {colour} cube"))
    return out


def test_film_starts_as_the_concatenating_model_and_binds_the_named_colour_to_the_pixels(tmp_path):
    config = RewardModelConfig(inputs={CAM: [8, 8, 3]}, width=8, vocabulary=["blue", "red"], film=True)
    film = RewardModel(config)
    plain = RewardModel(RewardModelConfig(inputs={CAM: [8, 8, 3]}, width=8, vocabulary=["blue", "red"]))
    plain.load_state_dict({k: v for k, v in film.state_dict().items() if not k.startswith("film.")})
    obs = {CAM: torch.randint(0, 256, (3, 8, 8, 3), dtype=torch.uint8), TASK: ["red", "blue", "green"]}
    assert torch.allclose(film(obs), plain(obs))  # zero-initialized FiLM: the identity
    eps = _two_cube_episodes(240)
    fit = FitConfig(epochs=30, batch_size=32, lr=3e-3, width=8, holdout=0.25, seed=0)
    model, _, held = fit_reward_model("classifier", eps, [success_targets(e) for e in eps], fit)
    assert model.config.film and model.film is not None
    concat, _, _ = fit_reward_model("classifier", eps, [success_targets(e) for e in eps],
                                    dataclasses.replace(fit, film=False))
    held_eps = [eps[i] for i in held]
    with_film, without = classifier_metrics(model, held_eps), classifier_metrics(concat, held_eps)
    assert with_film["accuracy"] >= 0.95 and without["accuracy"] <= 0.85, (with_film, without)
    loaded = load_reward_model(model.save(tmp_path / "film"))
    assert loaded.film is not None and torch.equal(loaded.predict(obs), model.predict(obs))


def test_counterfactual_instructions_add_each_success_as_a_failure_of_another_instruction():
    eps = _two_cube_episodes(40)
    swaps = instruction_swaps(eps, seed=0)
    successes = [e for e in eps if e.succeeded]
    assert len(swaps) == len(successes) > 0
    for original, swap in zip(successes, swaps):
        assert swap.obs is original.obs and swap.task != original.task and not swap.success.any()
    # one instruction: nothing to swap with, and a fit asked for it says why
    one = [Episode(obs=e.obs, success=e.success, task="lift the red cube") for e in eps]
    assert not instruction_swaps(one, seed=0)
    with pytest.raises(ValueError, match="fit.counterfactual"):
        fit_reward_model("classifier", one, [success_targets(e) for e in one],
                         FitConfig(epochs=1, width=4, holdout=0.0, counterfactual=True))


def test_fit_config_names_bad_settings():
    with pytest.raises(ValueError, match="fit.instruction"):
        FitConfig(instruction="maybe")
    with pytest.raises(ValueError, match="fit.lr_schedule"):
        FitConfig(lr_schedule="step")


def _chunk(final_state: list[float], after_state: list[float]) -> ChunkSteps:
    """Two envs, H = 3: env 0 ends (success) at step 1, env 1 runs the whole chunk."""
    h, n = 3, 2
    term = torch.tensor([[False, False], [True, False], [False, False]])
    final = {OBS_STATE: torch.tensor([[final_state[0], 0.0], [9.0, 9.0]]), TASK: ["a", "b"]}
    after = {OBS_STATE: torch.tensor([[7.0, 7.0], [after_state[1], 0.0]]), TASK: ["a", "b"]}
    return ChunkSteps(
        env_ids=[0, 1], reward=torch.zeros(h, n), terminated=term, truncated=torch.zeros(h, n, dtype=torch.bool),
        success=term.clone(), reward_terms={}, episode_return=torch.zeros(h, n),
        episode_length=torch.zeros(h, n, dtype=torch.long), final_obs=final, obs=after,
    )


def test_learned_terms_judge_each_chunks_outcome_and_pay_on_its_last_live_step(tmp_path):
    clf = _switch_model().save(tmp_path / "clf")
    prm = _switch_model("progress").save(tmp_path / "prm")
    cfg = RewardConfig(terms={"classifier": 1.0, "prm": 0.5, "success": 0.0},
                       classifier=ClassifierTermConfig(path=str(clf)), prm=ProgressTermConfig(path=str(prm)))
    fn = RewardFunction(cfg, "toy/hand")
    decision = {OBS_STATE: torch.tensor([[0.0, 0.0], [0.0, 0.0]]), TASK: ["a", "b"]}
    out = fn(_chunk(final_state=[1.0], after_state=[0.0, 0.0]), torch.zeros(2, 3, 1), decision)
    # env 0's outcome is its final obs (state[0] = 1: success); env 1's the obs after the chunk (0: not)
    assert out.step_terms["classifier"].tolist() == [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]]
    assert out.step_terms["prm"][1, 0] == pytest.approx(1.0, abs=1e-3)  # progress 0 -> 1 over the chunk
    assert out.step_terms["prm"][2, 1] == pytest.approx(0.0, abs=1e-3)
    assert out.reward[0] == pytest.approx(1.0 + 0.5, abs=1e-3) and out.reward[1] == pytest.approx(0.0, abs=1e-3)
    out = fn(_chunk(final_state=[0.0], after_state=[0.0, 1.0]), torch.zeros(2, 3, 1), decision)  # a new chunk
    assert out.step_terms["classifier"].tolist() == [[0.0, 0.0], [0.0, 0.0], [0.0, 1.0]]
    threshold0 = RewardFunction(RewardConfig(terms={"classifier": 1.0}, classifier=ClassifierTermConfig(
        path=str(clf), threshold=0.0)), "toy/hand")
    p = threshold0(_chunk([0.5], [0.0, 0.0]), torch.zeros(2, 3, 1), decision).step_terms["classifier"][1, 0]
    assert p == pytest.approx(float(torch.sigmoid(torch.tensor(0.0))), abs=1e-4)  # the probability itself


def test_learned_term_errors_name_what_is_wrong(tmp_path):
    with pytest.raises(CheckpointError, match="--reward.classifier.path"):
        RewardFunction(RewardConfig(terms={"classifier": 1.0}), "toy/hand")
    prm = _switch_model("progress").save(tmp_path / "prm")
    with pytest.raises(CheckpointError, match="'progress' model"):
        RewardFunction(RewardConfig(terms={"classifier": 1.0}, classifier=ClassifierTermConfig(path=str(prm))), "x")


def test_rollout_with_a_learned_term_stores_and_logs_it(tmp_path):
    torch.manual_seed(0)
    model = RewardModel(RewardModelConfig(inputs={CAM: [4, 4, 3], OBS_STATE: [2]}, width=4))
    path = model.save(tmp_path / "clf")
    cfg = RewardConfig(terms={"env": 1.0, "classifier": 0.5},
                       classifier=ClassifierTermConfig(path=str(path), threshold=0))
    engine = RolloutEngine(_counter_env(n=2), GaussianPolicy(2, 1, horizon=2, init_mean=0.2), reward=cfg)
    engine.reset(seed=0)
    ro = engine.collect(4, ActMode.EVAL)
    assert ro.step_reward_terms["classifier"].shape == (4, 2, 2)
    assert (ro.reward_terms["classifier"] > 0).all()  # a probability on each decision's last step
    assert torch.allclose(ro.rewards, ro.reward_terms["env"] + 0.5 * ro.reward_terms["classifier"])
    assert "reward/classifier" in reward_scalars(ro)
    bad = RewardModel(RewardModelConfig(inputs={CAM: [8, 8, 3]}, width=4)).save(tmp_path / "bad")
    cfg = RewardConfig(terms={"classifier": 1.0}, classifier=ClassifierTermConfig(path=str(bad)))
    engine = RolloutEngine(_counter_env(n=2), GaussianPolicy(2, 1, horizon=2), reward=cfg)
    engine.reset(seed=0)
    with pytest.raises(RewardInputError, match=r"toy/counter.*\[4, 4, 3\].*\[8, 8, 3\]"):
        engine.collect(1)


def test_dataset_episodes_are_labelled_with_the_state_each_frame_shows(tmp_path):
    from rewards.learned.data import EpisodeDataError, read_dataset_episodes
    from sim.dataset import EpisodeRecorder

    spec = CounterEnv().spec
    rec = EpisodeRecorder(tmp_path / "ds", "local/test", spec, fps=10)
    # next.success per frame: episode 0's third action reaches success (and ends it); episode 1's second action
    # reaches it and the episode goes on (a recording that does not end on success)
    for flags in ([False, False, True], [False, True, False]):
        for t, flag in enumerate(flags):
            obs = {OBS_STATE: torch.tensor([[float(t), 0.0]]), CAM: torch.full((1, 4, 4, 3), t, dtype=torch.uint8),
                   TASK: ["count"]}
            rec.add_frame(obs, torch.zeros(1), reward=float(flag), success=flag)
        rec.save_episode()
    root = rec.finalize()
    eps = read_dataset_episodes(root)
    # frame t shows the state after frame t-1's action; the last frame of an episode ended on success keeps its own
    assert [e.success.tolist() for e in eps] == [[False, False, True], [False, False, True]]
    assert eps[0].obs[CAM].dtype == torch.uint8 and eps[0].obs[CAM][2, 0, 0, 0] == 2 and eps[0].task == "count"
    assert eps[0].obs[OBS_STATE][:, 0].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(EpisodeDataError, match="no feature 'observation.images.wrist'"):
        read_dataset_episodes(root, keys=[image_key("wrist")])
    with pytest.raises(EpisodeDataError, match="not a LeRobotDataset"):
        read_dataset_episodes(tmp_path / "nothing")


def test_a_success_verdict_ends_the_episode_so_it_is_paid_once(tmp_path):
    """The classifier (P ~ 1 once position >= 0.5; the env's own goal, 9.0, is never reached) ends each episode
    at its first success verdict: the decision is terminal, the env is reset, the episode is recorded as ended by
    the reward (not an env success). Without ``terminate`` the same verdict is paid again on every later chunk."""
    clf = _switch_model().save(tmp_path / "clf")

    def run(terminate: bool):
        cfg = RewardConfig(terms={"classifier": 1.0}, classifier=ClassifierTermConfig(path=str(clf), terminate=terminate))
        env = _counter_env(n=2, goal=9.0, steps=40)
        engine = RolloutEngine(env, GaussianPolicy(2, 1, horizon=2, init_mean=0.2), reward=cfg)
        engine.reset(seed=0)
        try:
            return engine.collect(6, ActMode.EVAL)
        finally:
            env.close()

    ro = run(terminate=True)
    paid = ro.reward_terms["classifier"] > 0.5
    assert paid.any() and torch.equal(ro.terminated, paid)  # every payment ends its episode, nothing else does
    cut = [e for e in ro.episodes if e.ended_by_reward]
    assert len(cut) == int(paid.sum()) and not any(e.success for e in cut)
    assert rollout_scalars(ro)["rollout/ended_by_reward"] == pytest.approx(len(cut) / len(ro.episodes))
    t, b = paid.nonzero()[0].tolist()
    assert ro.obs[OBS_STATE][t + 1, b, 1] == 0.0  # the next decision starts a fresh episode (step counter 0)
    # each episode ends at the chunk that first reaches 0.5: from 0.0-0.2 at +0.4 a chunk, after 1-2 chunks
    assert all(e.length in (2, 4) for e in cut)

    farmed = run(terminate=False)
    assert not farmed.terminated.any()
    per_env = (farmed.reward_terms["classifier"] > 0.5).sum(0)
    assert (per_env >= 4).all()  # the same episode paid on chunk after chunk


def test_a_terminating_reward_refuses_pipelined_collection(tmp_path):
    clf = _switch_model().save(tmp_path / "clf")
    cfg = RewardConfig(terms={"classifier": 1.0}, classifier=ClassifierTermConfig(path=str(clf)))
    env = _counter_env(n=2)
    try:
        with pytest.raises(ValueError, match="terminate"):
            RolloutEngine(env, GaussianPolicy(2, 1, horizon=2), pipelined=True, reward=cfg)
        off = RewardConfig(terms={"classifier": 1.0}, classifier=ClassifierTermConfig(path=str(clf), terminate=False))
        assert RolloutEngine(env, GaussianPolicy(2, 1, horizon=2), pipelined=True, reward=off).pipelined
    finally:
        env.close()


def _progress_chunk(before: list[float], after: list[float], ended: list[bool],
                    env_ids: list[int] | None = None) -> tuple[ChunkSteps, dict]:
    """One decision of ``n`` envs, ``H = 1``: the switch model's progress goes from ~``before`` to ~``after``
    (it reads ``state[0]``: 0 -> 0, 0.5 -> 0.5, 1 -> 1); ``ended`` envs terminate at the step."""
    n = len(before)
    term = torch.tensor([ended])
    state = torch.tensor([[a, 0.0] for a in after])
    outcome = {OBS_STATE: state, TASK: ["a"] * n}
    steps = ChunkSteps(
        env_ids=env_ids or list(range(n)), reward=torch.zeros(1, n), terminated=term,
        truncated=torch.zeros(1, n, dtype=torch.bool), success=term.clone(), reward_terms={},
        episode_return=torch.zeros(1, n), episode_length=torch.zeros(1, n, dtype=torch.long),
        final_obs=outcome, obs=dict(outcome))
    return steps, {OBS_STATE: torch.tensor([[b, 0.0] for b in before]), TASK: ["a"] * n}


def test_milestone_progress_pays_each_episodes_new_best_once_and_restarts_with_the_episode(tmp_path):
    prm = _switch_model("progress").save(tmp_path / "prm")

    def fn(mode: str) -> RewardFunction:
        return RewardFunction(RewardConfig(terms={"prm": 1.0}, prm=ProgressTermConfig(path=str(prm), mode=mode)), "t")

    # env 0 climbs, falls back, climbs again, ends at the top, then starts a new episode; env 1 starts halfway
    chunks = [([0.0, 0.5], [0.5, 0.5], [False, False]), ([0.5, 0.5], [0.0, 1.0], [False, False]),
              ([0.0, 1.0], [0.5, 0.0], [False, False]), ([0.5, 0.0], [1.0, 1.0], [True, False]),
              ([0.0, 1.0], [0.5, 1.0], [False, False])]
    milestone, potential = fn("milestone"), fn("potential")
    paid = {"milestone": [], "potential": []}
    for before, after, ended in chunks:
        for name, f in (("milestone", milestone), ("potential", potential)):
            steps, obs = _progress_chunk(before, after, ended)
            paid[name].append(f(steps, torch.zeros(2, 1, 1), obs).reward.tolist())
    got = torch.tensor(paid["milestone"])
    # the drop (0.5 -> 0) costs nothing and the climb back to 0.5 pays nothing; the new episode is paid again
    torch.testing.assert_close(got, torch.tensor([[0.5, 0.0], [0.0, 0.5], [0.0, 0.0], [0.5, 0.0], [0.5, 0.0]]),
                               atol=1e-3, rtol=0)
    assert got[:4, 0].sum() == pytest.approx(1.0, abs=1e-3)  # the first episode: its best minus its start
    torch.testing.assert_close(torch.tensor(paid["potential"]),  # the difference pays the drop back and forth
                               torch.tensor([[0.5, 0.0], [-0.5, 0.5], [0.5, -1.0], [0.5, 1.0], [0.5, 0.0]]),
                               atol=1e-3, rtol=0)
    # a reset of every env restarts every episode from where it is (env 1's best, 1, is forgotten)
    milestone.reset()
    steps, obs = _progress_chunk([0.5, 0.0], [0.5, 0.5], [False, False])
    torch.testing.assert_close(milestone(steps, torch.zeros(2, 1, 1), obs).reward, torch.tensor([0.0, 0.5]),
                               atol=1e-3, rtol=0)
    # envs 2 and 3 (the other half of a pipelined rollout) keep their own episodes
    steps, obs = _progress_chunk([0.0, 0.5], [1.0, 0.5], [False, False], env_ids=[2, 3])
    torch.testing.assert_close(milestone(steps, torch.zeros(2, 1, 1), obs).reward, torch.tensor([1.0, 0.0]),
                               atol=1e-3, rtol=0)
    steps, obs = _progress_chunk([0.5, 0.5], [1.0, 1.0], [False, False])  # envs 0 and 1 again: best 0.5 each
    torch.testing.assert_close(milestone(steps, torch.zeros(2, 1, 1), obs).reward, torch.tensor([0.5, 0.5]),
                               atol=1e-3, rtol=0)
    with pytest.raises(ValueError, match=r"reward.prm.mode: 'best'.*potential, milestone"):
        ProgressTermConfig(path=str(prm), mode="best")


def test_milestone_progress_is_the_same_in_pipelined_and_sequential_rollouts(tmp_path):
    """The pipelined engine scores half of the envs at a time; the term's per-episode best is kept by env id,
    so both collections pay the same, and every episode's payments sum to its best progress minus its start."""
    from sim.vector_process import ProcessVecEnv

    prm = _switch_model("progress").save(tmp_path / "prm")
    cfg = RewardConfig(terms={"prm": 1.0}, prm=ProgressTermConfig(path=str(prm), mode="milestone"))
    torch.manual_seed(0)
    policy = GaussianPolicy(2, 1, horizon=2, init_mean=0.3)
    with torch.no_grad():  # up at first, down later in the episode: progress rises and falls
        policy.mu.weight.copy_(torch.tensor([[0.0, -0.12]] * 2))
    factories = [functools.partial(CounterEnv, episode_steps=8, goal=9.0) for _ in range(4)]
    rollouts = []
    for pipelined in (False, True):
        with ProcessVecEnv(factories, "toy/counter", num_workers=2) as env:
            engine = RolloutEngine(env, policy, use_critic=False, pipelined=pipelined, reward=cfg)
            engine.reset(seed=3)
            rollouts.append(engine.collect(10, ActMode.EVAL))
    seq, pipe = rollouts
    torch.testing.assert_close(seq.reward_terms["prm"], pipe.reward_terms["prm"], atol=1e-6, rtol=0)
    paid = seq.reward_terms["prm"]
    assert (paid >= 0).all() and (paid > 0.05).any()
    # an episode of decisions t0..t (ended at t) is paid on t0..t-1 for the outcomes obs[t0+1..t] (its last
    # outcome, the final observation, is not stored): max(progress of obs[t0..t]) - progress(obs[t0])
    model = load_reward_model(prm)
    progress = model.predict({OBS_STATE: seq.obs[OBS_STATE].reshape(-1, 2)}).reshape(paid.shape)
    done = seq.truncated | seq.terminated
    checked = 0
    for b in range(paid.shape[1]):
        t0 = 0
        for t in done[:, b].nonzero().flatten().tolist():
            if t > t0:
                best = float(progress[t0:t + 1, b].max())
                assert float(paid[t0:t, b].sum()) == pytest.approx(best - float(progress[t0, b]), abs=1e-4)
                checked += 1
            t0 = t + 1
    assert checked >= 4


def test_potential_shaping_under_gae_is_a_change_of_the_critics_baseline():
    """Why the ``potential`` form barely speeds PPO up (docs/rewards.md): with gamma = 1, adding
    ``progress(s') - progress(s)`` to the rewards gives exactly the advantages of the unshaped rewards under the
    critic ``V + progress``, except that a terminating step keeps ``progress(s_T)``; a critic fit to the shaped
    returns then gives the advantages of the sparse reward with each termination paid ``progress(s_T)`` more."""
    from vla_rl.algorithms.advantages import gae

    gen = torch.Generator().manual_seed(0)
    t, b = 6, 3
    r, v, phi, phi_next_last = (torch.rand(t, b, generator=gen) for _ in range(4))
    nv = torch.cat([v[1:], torch.rand(1, b, generator=gen)])
    phi_next = torch.cat([phi[1:], phi_next_last[:1]])
    no = torch.zeros(t, b, dtype=torch.bool)
    shaped, _ = gae(r + phi_next - phi, v, nv, no, no, 1.0, 0.9)
    rebased, _ = gae(r, v + phi, nv + phi_next, no, no, 1.0, 0.9)
    torch.testing.assert_close(shaped, rebased)
    milestone = r + (phi_next - phi).clamp(min=0)  # not a potential difference: no critic absorbs it
    assert not torch.allclose(gae(milestone, v, nv, no, no, 1.0, 0.9)[0], rebased)
    # where an episode terminates (success ends it), nothing bootstraps: the progress of the terminal state is paid
    # on top of the reward, which no critic absorbs, so the shaped advantages are those of rewards that pay
    # progress(s_T) with each termination (a success worth 1 + w * progress(success state))
    term = torch.zeros(t, b, dtype=torch.bool)
    term[2, 0] = term[4, 1] = True
    shaped, _ = gae(r + phi_next - phi, v, nv, term, no, 1.0, 0.9)
    torch.testing.assert_close(shaped, gae(r + phi_next * term, v + phi, nv + phi_next, term, no, 1.0, 0.9)[0])
    assert not torch.allclose(shaped, gae(r, v + phi, nv + phi_next, term, no, 1.0, 0.9)[0])
    # a time-limit cut bootstraps: there the difference stays a change of baseline
    shaped, _ = gae(r + phi_next - phi, v, nv, no, term, 1.0, 0.9)
    torch.testing.assert_close(shaped, gae(r, v + phi, nv + phi_next, no, term, 1.0, 0.9)[0])


def test_stage_targets_read_the_long_horizon_task_and_refuse_an_index_that_is_no_task():
    # pick-place-stack (8 stages): the red cube resting on the pad holds reach, grasp, lift and place, 4 / 9;
    # before that, the arm far away holds none
    task = TASK_INDEX["pick-place-stack"]
    far = np.array([0.3, 0.0, 0.2, 1.0, *np.zeros(7)], np.float32)
    pad = (0.5, 0.1)
    frames = [_env_state("pick-red", (0.45, 0.0, 0.02), pad), _env_state("pick-red", (0.5, 0.1, 0.02), pad)]
    env_state = torch.tensor(np.stack(frames))
    env_state[:, -1] = task
    ep = Episode(obs={OBS_STATE: torch.tensor(np.stack([far, far])), OBS_ENV_STATE: env_state},
                 success=torch.tensor([False, False]), task="x")
    assert stage_targets(ep).tolist() == pytest.approx([0.0, 4 / 9])
    env_state[1, -1] = task + 1  # past the last task
    with pytest.raises(ValueError, match=f"task index {task + 1} in 'observation.env_state'"):
        stage_targets(ep)
