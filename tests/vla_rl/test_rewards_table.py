"""The learned-rewards tables (``docs/benchmarks.md``) are what ``benchmarks/learned_rewards.py --render`` makes of
``benchmarks/results/rewards.json``, so the numbers in the docs can be traced to the results file; a curriculum run
resumed in segments is timed over all of them."""

import argparse
import copy
import dataclasses
import json
import math
from pathlib import Path

import pytest

from tests.benchmarks import docs_section, load_benchmark

bench = load_benchmark("learned_rewards")

_TITLE = "## Learned rewards (issue 19)"
_COLUMN = "| wall s | RL s, all segments |"


def _results() -> dict:
    return json.loads(bench.RESULTS.read_text())


def test_docs_tables_are_rendered_from_the_results_file():
    results = _results()
    docs = docs_section(_TITLE)
    assert docs == bench.render(results).strip("\n")
    assert bench.curriculum_keys(results), "rewards.json holds no curriculum section"


def test_rl_seconds_sum_every_segment_of_a_resumed_run():
    first = [{"step": 0, "eval/success": 0.2}, {"step": 768, "time/iteration_s": 7.0, "time/eval_s": 1.0},
             {"step": 1536, "time/iteration_s": 8.0}]
    resumed = [{"step": 2304, "time/iteration_s": 9.5}, {"step": 3072, "time/iteration_s": None}]
    assert bench.rl_seconds(first) == 15.0
    assert bench.rl_seconds(first + resumed) == 24.5


def test_curriculum_table_shows_rl_seconds_only_when_every_arm_has_them():
    results = _results()
    key = bench.curriculum_keys(results)[-1]
    section = copy.deepcopy(results[key])
    only = {key: section}
    arms = [arm for row in section["seeds"].values() for arm in row["arms"].values()]
    for arm in arms:
        arm.pop("rl_s", None)
    assert _COLUMN not in bench.render(only)
    for arm in arms:
        arm["rl_s"] = 1234.0
    table = bench.render(only)
    assert _COLUMN in table and "| 1234 |" in table
    first_arm = next(iter(next(iter(section["seeds"].values()))["arms"].values()))
    del first_arm["rl_s"]
    assert _COLUMN not in bench.render(only)


def test_reeval_tables_pair_each_sampler_with_uniform_per_seed_and_pooled():
    results = _results()
    key = next(k for k in bench.curriculum_keys(results) if len(results[k]["seeds"]) >= 2)
    section = copy.deepcopy(results[key])
    seeds = sorted(section["seeds"], key=int)[:2]
    section["seeds"] = {s: section["seeds"][s] for s in seeds}
    other = next(name for name in section["seeds"][seeds[0]]["arms"] if name != "uniform")
    made = {"uniform": ["1100", "0000"], other: ["1110", "0001"]}  # per seed, each of two tasks: +1 episode of 4
    for i, s in enumerate(seeds):
        for sampler, arm in section["seeds"][s]["arms"].items():
            outcomes = {"t1": made[sampler][i], "t2": made[sampler][i]}
            wins = sum(seq.count("1") for seq in outcomes.values())
            arm["reeval"] = {"episodes_per_task": 4, "success": wins / 8, "ci": [0.0, 1.0], "episodes": 8,
                             "outcomes": outcomes, "wall_s": 60.0, "date": "2026-11-30", "load_average_at_end": 2.0}
    table = bench.render({key: section})
    assert f"| {seeds[0]} | {other} | 0.750 [0.00-1.00] | +0.250 [" in table  # 2 of 8 episodes better
    pooled = next(line for line in table.splitlines() if line.startswith(f"| {other} | 0.500 ["))
    assert "| +0.250 [" in pooled and "| 2 of 2 | 16 |" in pooled
    del section["seeds"][seeds[1]]["arms"]["uniform"]["reeval"]  # a seed not fully re-evaluated is left out
    table = bench.render({key: section})
    assert f"| {seeds[1]} | {other} | 0.250" not in table and f"| {seeds[0]} | {other} | 0.750" in table
    assert "| vs uniform, paired [95% CI] | seeds above uniform |" not in table  # one seed: nothing to pool


def test_prm_crossing_on_single_evaluations_and_on_trailing_means():
    sparse = [(0, 0.30), (100, 0.40), (200, 0.36), (300, 0.50)]
    mixed = [(0, 0.30), (100, 0.52), (200, 0.38), (300, 0.45)]
    # single evaluations: the sparse final is 0.50 and the PRM run's one lucky evaluation at 100 reaches it
    assert bench.prm_crossing(sparse, mixed) == (0.50, 100, 100 / 300)
    # trailing means of 3: the sparse run ends at (0.40 + 0.36 + 0.50) / 3 = 0.42; the PRM run's means are
    # 0.30, 0.41, 0.40, 0.45: reached at 300, not at the noisy 100
    target, steps, ratio = bench.prm_crossing(sparse, mixed, window=3)
    assert abs(target - 0.42) < 1e-9 and steps == 300 and ratio == 1.0
    never = bench.prm_crossing(sparse, [(0, 0.30), (100, 0.35)])
    assert never[1] is None and never[2] != never[2]  # nan: never reached
    # the step-0 evaluation (the shared start) never counts, however high
    assert bench.prm_crossing([(0, 0.6), (100, 0.5)], [(0, 0.6), (100, 0.4)])[1] is None


def test_a_prm_run_that_gets_there_early_and_then_collapses_does_not_meet_the_target():
    row = {"sparse_improved": True, "sparse_final": 0.59, "step_ratio": 0.38, "mixed_final": 0.60}
    assert bench.prm_ok(row)
    assert not bench.prm_ok({**row, "mixed_final": 0.14})  # session 41, seed 2: reached at 0.38, ended at 0.14
    assert bench.prm_ok({**row, "mixed_final": 0.56})  # inside the sparse final's 95% interval (0.54-0.64)
    assert not bench.prm_ok({**row, "step_ratio": 0.75})
    assert not bench.prm_ok({**row, "step_ratio": float("nan")})  # never reached
    assert not bench.prm_ok({**row, "sparse_improved": False})


def test_a_pre_trained_start_made_another_way_is_refused_by_name(tmp_path):
    run = tmp_path / "pretrained-s0"
    run.mkdir()
    (run / "report.json").write_text("{}")
    stack = bench.Start("mujoco/stack-any", demos=200, sft_steps=6000, success=0.25, check_every=500)
    bench.write_json(run / "start.json", bench.dataclasses.asdict(stack))
    assert bench.pretrained(0, tmp_path, stack) == run
    with pytest.raises(SystemExit, match=r"pretrained-s0 was pre-trained as .*mujoco/stack-any.*not .*mujoco/pick-any"):
        bench.pretrained(0, tmp_path, bench.Start())


def test_a_start_folder_from_before_the_env_option_reads_as_the_quickstart_task(tmp_path):
    run = tmp_path / "pretrained-s1"
    run.mkdir()
    (run / "report.json").write_text("{}")
    (run / "start_success.json").write_text(json.dumps({"start_success": 0.35}))
    assert bench.pretrained(1, tmp_path, bench.Start(success=0.35)) == run
    with pytest.raises(SystemExit, match="success=0.35"):
        bench.pretrained(1, tmp_path, bench.Start())


def test_the_start_sets_the_imitation_and_its_checks():
    from vla_rl.commands.quickstart import SFTConfig

    base = SFTConfig(steps=700, episodes=50)
    assert bench.Start().sft(base) == base  # the preset's pre-training, untouched
    sft = bench.Start("mujoco/stack-any", demos=200, sft_steps=6000, success=0.25, check_every=500).sft(base)
    assert (sft.steps, sft.episodes, sft.stop_at_success, sft.check_every, sft.check_from) == (6000, 200, 0.25, 500, 1000)
    assert bench.Start("mujoco/stack-any").env(num_envs=16, workers=0).id == "mujoco/stack-any"


def test_the_prm_section_names_a_task_and_start_other_than_the_quickstarts():
    results = _results()
    section = copy.deepcopy(results[bench.prm_keys(results)[0]])  # on the quickstart's task and start
    assert bench._start(section) == ""
    section["conditions"]["args"].update(env="mujoco/stack-any", demos=200, sft_steps=6000, start_success=0.25,
                                         check_every=500)
    text = bench._start(section)
    assert "`mujoco/stack-any`" in text and "200 expert demos, 6000 imitation steps at most" in text
    assert "every 500 steps, that reached 0.25" in text


def test_a_second_sparse_run_is_read_against_the_first_both_ways_and_the_prm_run_against_each():
    a = [(0, 0.20), (100, 0.25), (200, 0.30), (300, 0.32), (400, 0.35), (500, 0.36)]
    b = [(0, 0.20), (100, 0.22), (200, 0.37), (300, 0.30), (400, 0.31), (500, 0.33)]
    prm = [(0, 0.20), (100, 0.30), (200, 0.33), (300, 0.40), (400, 0.34), (500, 0.31)]
    mean = [(s, (x + y) / 2) for (s, x), (_, y) in zip(a, b)]
    b_vs_a, a_vs_b = bench.compare(a, b), bench.compare(b, a)
    # B's lucky 0.37 at 40% reaches A's final 0.36, and B ends at 0.33, inside A's final's interval: met by chance
    assert (b_vs_a["step_ratio"], b_vs_a["ok"]) == (0.4, True)
    assert (a_vs_b["sparse_final"], a_vs_b["step_ratio"], a_vs_b["ok"]) == (0.33, 0.8, False)
    prm_vs_mean = bench.compare(mean, prm)  # the mean ends at 0.345 [0.300-]: reached at 300, PRM ends inside
    assert prm_vs_mean["sparse_final"] == pytest.approx(0.345) and prm_vs_mean["ok"]
    row = {"seed": 5, "rl_seed": 105, "start": 0.2, "sparse_steps": 500, "a_curve": a, "b_curve": b,
           "b_vs_a": b_vs_a, "a_vs_b": a_vs_b, "mixed_run": "prm-mixed-progress-v3-s5", "mixed_curve": prm,
           "prm_vs_a": bench.compare(a, prm), "prm_vs_b": bench.compare(b, prm), "prm_vs_mean": prm_vs_mean}
    no_prm = {k: v for k, v in row.items() if not k.startswith(("prm", "mixed_curve"))}
    section = {"seeds": {"5": row, "6": {**no_prm, "seed": 6}}, "conditions": {"args": {}}}
    table = "\n".join(bench.render_replicate("prm-replicate (test)", section))
    # PRM vs A: reaches 0.36 at 300 (0.60) but ends at 0.31, below A's final's interval [0.314-]; vs B at 200
    assert ("| 5 | 0.200 | 0.360 | 0.330 | 0.40 | yes | 0.80 | no | 0.310 | 0.60 | no | 0.40 | yes | 0.345 | 0.60 | "
            "yes |") in table
    assert "| 6 | 0.200 | 0.360 | 0.330 | 0.40 | yes | 0.80 | no | - | - | - | - | - | 0.345 | - | - |" in table
    assert "Met: B vs A 2 of 2; A vs B 0 of 2; PRM vs A 0 of 1; PRM vs B 1 of 1; PRM vs mean 1 of 1." in table


def test_two_runs_per_arm_read_the_prm_mean_against_the_sparse_mean_per_seed_and_over_all_seeds():
    a = [(0, 0.20), (100, 0.25), (200, 0.30), (300, 0.32), (400, 0.35), (500, 0.36)]
    b = [(0, 0.20), (100, 0.22), (200, 0.37), (300, 0.30), (400, 0.31), (500, 0.33)]
    prm_a = [(0, 0.20), (100, 0.30), (200, 0.33), (300, 0.40), (400, 0.34), (500, 0.31)]
    prm_b = [(0, 0.20), (100, 0.24), (200, 0.26), (300, 0.28), (400, 0.30), (500, 0.29)]
    sparse_mean, prm_mean = bench.pooled_curve([a, b]), bench.pooled_curve([prm_a, prm_b])
    # the sparse mean ends at 0.345; the PRM mean peaks at 0.34 (300) and ends at 0.30: never reached
    assert math.isnan(bench.compare(sparse_mean, prm_mean)["step_ratio"])

    def row(seed: int, prm_b: list[tuple[int, float]]) -> dict:
        return {"seed": seed, "rl_seed": seed + 100, "start": 0.2, "sparse_steps": 500, "a_curve": a, "b_curve": b,
                "b_vs_a": bench.compare(a, b), "a_vs_b": bench.compare(b, a), "mixed_run": f"prm-mixed-s{seed}",
                "mixed_curve": prm_a, "prm_vs_a": bench.compare(a, prm_a), "prm_vs_b": bench.compare(b, prm_a),
                "prm_vs_mean": bench.compare(sparse_mean, prm_a), "mixed_b_curve": prm_b,
                "prm_b_vs_mean": bench.compare(sparse_mean, prm_b),
                "prm_mean_vs_mean": bench.compare(sparse_mean, bench.pooled_curve([prm_a, prm_b]))}

    lucky = [(0, 0.20), (100, 0.36), (200, 0.40), (300, 0.41), (400, 0.40), (500, 0.42)]
    section = {"seeds": {"5": row(5, prm_b), "6": row(6, lucky)}, "conditions": {"args": {}}}
    table = "\n".join(bench.render_replicate("prm-replicate (test)", section))
    assert "| 5 | 0.200 | 0.360 | 0.330 | 0.345 | 0.310 | 0.290 | 0.300 | - | no | - | no |" in table
    # seed 6: the PRM mean 0.33 / 0.365 reaches 0.345 at 200 (0.40) and ends at 0.365: met
    assert "| 6 | 0.200 | 0.360 | 0.330 | 0.345 | 0.310 | 0.420 | 0.365 | 0.20 | yes | 0.40 | yes |" in table
    # over both seeds the PRM mean (0.30 / 0.33 / 0.3725 / 0.345 / 0.3325) reaches 0.345 at 300 and ends inside
    # its interval at 1,600 episodes [0.322-]
    assert "| all seeds | 0.200 | | | 0.345 | | | 0.333 | | | 0.60 | yes |" in table
    assert "Met (PRM mean vs sparse mean): 1 of 2 seeds; over all seeds: yes." in table
    with pytest.raises(ValueError, match="different env steps"):
        bench.pooled_curve([a, a[:-1]])


def test_second_runs_are_made_as_the_first_without_normalization_extended_and_one_arm_per_process(monkeypatch,
                                                                                                    tmp_path):
    ran = []

    def fake_run(seed, run, reward, iterations, eval_every, **kw):
        ran.append((run.name, iterations, kw["rl_seed"], kw["algo"], sorted(reward.terms)))
        (run / "checkpoints").mkdir(parents=True, exist_ok=True)
        (run / "report.json").write_text("{}")

    monkeypatch.setattr(bench, "quickstart_run", fake_run)
    monkeypatch.setattr(bench, "pretrained", lambda seed, out, start: out)
    mixed = bench.mixed_run(tmp_path, 2, "progress-v3", "milestone", 0.25, 0.0, norm=False, iterations=400)
    reward = bench.prm_reward(tmp_path / "progress-v3-s2", 0.25, "milestone", 0.0)
    with pytest.raises(SystemExit, match="prm-sparse-nonorm-it400-s2"):  # A is read, so it must exist
        bench.part_prm_replicate(2, tmp_path, 400, 40, 8, bench.Start(), mixed, reward, norm=False, extend=200)
    _run(tmp_path / "prm-sparse-nonorm-it400-s2", [(0, 0.2), (40, 0.3)])
    with pytest.raises(SystemExit, match="no PRM"):
        bench.part_prm_replicate(2, tmp_path, 400, 40, 8, bench.Start(), mixed, reward, norm=False, extend=200)
    _run(mixed, [(0, 0.2), (40, 0.35)])
    # B's sparse run alone: its own 200-iteration run first, then a copy resumed to 400, RL seed 102, no norm
    assert bench.part_prm_replicate(2, tmp_path, 400, 40, 8, bench.Start(), mixed, reward, norm=False, extend=200,
                                    arms=("sparse",)) is None
    no_norm = {"normalize_advantages": False}
    assert ran == [("prm-sparse-nonorm-r100-s2", 200, 102, no_norm, ["success"]),
                   ("prm-sparse-nonorm-it400-r100-s2", 400, 102, no_norm, ["success"])]
    ran.clear()
    assert bench.part_prm_replicate(2, tmp_path, 400, 40, 8, bench.Start(), mixed, reward, norm=False, extend=200,
                                    arms=("prm",)) is None
    assert ran == [("prm-mixed-progress-v3-milestone-w0.25-a0-nonorm-it400-r100-s2", 400, 102, no_norm,
                    ["prm", "success"])]
    for run in ("prm-sparse-nonorm-it400-r100-s2", "prm-mixed-progress-v3-milestone-w0.25-a0-nonorm-it400-r100-s2"):
        (tmp_path / run / "metrics.jsonl").write_text("".join(
            json.dumps({"step": s, "eval/success": v}) + "\n" for s, v in [(0, 0.2), (40, 0.25)]))
    ran.clear()
    row = bench.part_prm_replicate(2, tmp_path, 400, 40, 8, bench.Start(), mixed, reward, norm=False, extend=200)
    assert ran == [] and row["mixed_b_run"].endswith("-r100-s2")  # both read, not run again
    section = {"seeds": {"2": row}, "conditions": {"args": {}}}
    text = "\n".join(bench.render_replicate("prm-replicate (test)", section))
    assert "without normalizing them over each rollout" in text
    assert "B, as A, ran 200 iterations and was then continued" in text


def test_second_runs_explore_with_the_first_runs_sampler(monkeypatch, tmp_path):
    # --explore_noise / --noise_level reach B's runs as the prm part's: same folder names, same policy sampler
    ran = []

    def fake_run(seed, run, reward, iterations, eval_every, **kw):
        sampler = kw["policy"].sampler
        ran.append((run.name, kw["rl_seed"], sampler.noise_level, sampler.explore_noise.value))
        (run / "checkpoints").mkdir(parents=True, exist_ok=True)
        (run / "report.json").write_text("{}")

    monkeypatch.setattr(bench, "quickstart_run", fake_run)
    monkeypatch.setattr(bench, "pretrained", lambda seed, out, start: out)
    zero = {"explore_noise": "zero"}
    mixed = bench.mixed_run(tmp_path, 4, "progress-v3", "potential", 1.0, None, sampler=zero, norm=False,
                            iterations=400)
    assert mixed.name == "prm-mixed-progress-v3-n0.5z-nonorm-it400-s4"
    reward = bench.prm_reward(tmp_path / "progress-v3-s4", 1.0, "potential", None)
    with pytest.raises(SystemExit, match="prm-sparse-n0.5z-nonorm-it400-s4"):  # A made with the same sampler
        bench.part_prm_replicate(4, tmp_path, 400, 40, 8, bench.Start(), mixed, reward, norm=False, sampler=zero)
    _run(tmp_path / "prm-sparse-n0.5z-nonorm-it400-s4", [(0, 0.2), (40, 0.3)])
    _run(mixed, [(0, 0.2), (40, 0.35)])
    for arm in ("sparse", "prm"):
        assert bench.part_prm_replicate(4, tmp_path, 400, 40, 8, bench.Start(), mixed, reward, norm=False,
                                        arms=(arm,), sampler=zero) is None
    assert ran == [("prm-sparse-n0.5z-nonorm-it400-r100-s4", 104, 0.5, "zero"),
                   ("prm-mixed-progress-v3-n0.5z-nonorm-it400-r100-s4", 104, 0.5, "zero")]
    for run in ("prm-sparse-n0.5z-nonorm-it400-r100-s4", "prm-mixed-progress-v3-n0.5z-nonorm-it400-r100-s4"):
        (tmp_path / run / "metrics.jsonl").write_text("".join(
            json.dumps({"step": s, "eval/success": v}) + "\n" for s, v in [(0, 0.2), (40, 0.25)]))
    row = bench.part_prm_replicate(4, tmp_path, 400, 40, 8, bench.Start(), mixed, reward, norm=False, sampler=zero)
    assert row["sampler"] == zero
    text = "\n".join(bench.render_replicate("prm-replicate (test)", {"seeds": {"4": row}, "conditions": {"args": {}}}))
    assert "chains from zero noise" in text


def _run(folder, curve):
    folder.mkdir(parents=True)
    folder.joinpath("metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "eval/success": v}) + "\n" + json.dumps({"step": s + 1, "rollout/success": 0.1}) + "\n"
        for s, v in curve))


def test_a_prm_run_at_another_actor_step_is_also_read_against_the_presets_sparse_runs(tmp_path):
    a = [(0, 0.20), (100, 0.25), (200, 0.30), (300, 0.32), (400, 0.35), (500, 0.36)]
    b = [(0, 0.20), (100, 0.22), (200, 0.37), (300, 0.30), (400, 0.31), (500, 0.33)]
    prm = [(0, 0.20), (100, 0.30), (200, 0.35), (300, 0.40), (400, 0.34), (500, 0.38)]
    assert bench.mixed_run(tmp_path, 5, "progress-v3", "milestone", 0.5, 0.0, 1e-4).name == \
        "prm-mixed-progress-v3-milestone-w0.5-a0-lr0.0001-s5"
    # --ema: both arms' folders are named by it, and never share the preset's (whose evaluations it changes)
    assert bench.mixed_run(tmp_path, 5, "progress-v3", "milestone", 0.5, 0.0, ema=0.95).name == \
        "prm-mixed-progress-v3-milestone-w0.5-a0-ema0.95-s5"
    assert bench.sparse_run(tmp_path, 5, ema=0.95).name == "prm-sparse-ema0.95-s5"
    assert bench.sparse_run(tmp_path, 5, 1e-4, ema=0.9).name == "prm-sparse-lr0.0001-ema0.9-s5"
    assert bench.vs_preset(tmp_path, 5, prm, 400) == {}  # no preset runs: nothing to read
    _run(tmp_path / "prm-sparse-s5", a)
    _run(tmp_path / "prm-sparse-r100-s6", b)  # another seed's B is not this seed's
    only_a = bench.vs_preset(tmp_path, 5, prm, 400)
    assert set(only_a) == {"preset_a_curve", "vs_preset_a"} and only_a["preset_a_curve"] == a
    _run(tmp_path / "prm-sparse-r100-s5", b)
    row = bench.vs_preset(tmp_path, 5, prm, 400)
    # A's final 0.36: reached at 300 (0.60), the PRM ends at 0.38; the mean's 0.345 at 200 (0.40)
    assert (row["vs_preset_a"]["step_ratio"], row["vs_preset_a"]["ok"]) == (0.6, True)
    assert row["vs_preset_mean"]["sparse_final"] == pytest.approx(0.345)
    assert (row["vs_preset_mean"]["step_ratio"], row["vs_preset_mean"]["ok"]) == (0.4, True)
    assert bench.vs_preset(tmp_path, 5, prm[:-1], 400) == {}  # evaluated at other steps: not comparable
    other_start = [(0, 0.25)] + prm[1:]
    assert bench.vs_preset(tmp_path, 5, other_start, 400) == {}
    section = {"seeds": {"5": {"seed": 5, **row}, "6": {"seed": 6, "vs_preset_a": only_a["vs_preset_a"]},
                         "7": {"seed": 7}}}
    table = "\n".join(bench.render_vs_preset(section))
    assert "actor step 3e-05" in table
    assert "| 5 | 0.360 | 300 | 0.60 | yes | 0.345 | 200 | 0.40 | yes |" in table
    assert "| 6 | 0.360 | 300 | 0.60 | yes | - | - | - | - |" in table
    assert "| 7 |" not in table
    assert bench.render_vs_preset({"seeds": {"7": {"seed": 7}}}) == []


def test_gentler_exploration_names_both_arms_and_reaches_the_rl_stages_sampler():
    # --noise_level / --explore_noise: both arms' folders are named by them, never the preset's runs
    gentle = {"noise_level": 0.25, "explore_noise": "zero"}
    assert bench.sparse_run(Path("o"), 3, sampler=gentle).name == "prm-sparse-n0.25z-s3"
    assert bench.mixed_run(Path("o"), 3, "progress-v3", "milestone", 0.5, 0.0, sampler={"noise_level": 0.3}).name \
        == "prm-mixed-progress-v3-milestone-w0.5-a0-n0.3-s3"
    policy = bench.preset_policy(gentle)
    preset = bench.preset_policy(None)
    assert (policy.sampler.noise_level, policy.sampler.explore_noise.value) == (0.25, "zero")
    assert (preset.sampler.noise_level, preset.sampler.explore_noise.value) == (0.5, "random")
    assert dataclasses.replace(policy, sampler=preset.sampler) == preset  # nothing else moves
    args = argparse.Namespace(noise_level=None, explore_noise=None)
    assert bench.sampler_fields(args) is None
    args.noise_level = 0.25
    assert bench.sampler_fields(args) == {"noise_level": 0.25}


def test_a_prm_section_says_how_its_runs_explore():
    assert bench._explore({"noise_level": 0.25, "explore_noise": "zero"}).startswith(
        "Both runs explore at Flow-SDE noise level 0.25, chains from zero noise")
    assert "the preset's noise level, chains from zero noise" in bench._explore({"explore_noise": "zero"})


def test_runs_without_advantage_normalization_are_named_apart_from_the_presets_and_pass_it_to_ppo(monkeypatch,
                                                                                                    tmp_path):
    assert bench.sparse_run(Path("o"), 2, norm=False).name == "prm-sparse-nonorm-s2"
    assert bench.sparse_run(Path("o"), 2).name == "prm-sparse-s2"
    assert bench.mixed_run(Path("o"), 2, "progress-v3", "milestone", 0.5, 0.0, norm=False).name \
        == "prm-mixed-progress-v3-milestone-w0.5-a0-nonorm-s2"
    seen = []

    def fake_run(seed, run, reward, iterations, eval_every, **kw):
        seen.append((run.name, kw["algo"]))
        raise SystemExit("stop after the first run")

    (tmp_path / "progress-v3-s2").mkdir()
    (tmp_path / "progress-v3-s2" / "config.json").write_text("{}")
    monkeypatch.setattr(bench, "quickstart_run", fake_run)
    monkeypatch.setattr(bench, "pretrained", lambda seed, out, start: out)
    monkeypatch.setattr(bench, "prm_reward", lambda *a: None)
    with pytest.raises(SystemExit):
        bench.part_prm(2, tmp_path, 200, 5, 0.5, 8, name="progress-v3", mode="milestone", anneal=0.0, norm=False)
    assert seen == [("prm-mixed-progress-v3-milestone-w0.5-a0-nonorm-s2", {"normalize_advantages": False})]


def test_a_prm_trained_before_is_reported_from_the_row_recorded_beside_it(monkeypatch, tmp_path):
    (tmp_path / "progress-v3-s1").mkdir()
    (tmp_path / "progress-v3-s1" / "config.json").write_text("{}")
    recorded = {"seed": 1, "spearman": 0.54, "policy_episodes": 200}
    bench.model_row_path("progress-v3", 1, tmp_path).write_text(json.dumps(recorded))
    curve = [(0, 0.1), (10, 0.2)]
    for run in ("prm-sparse-s1", "prm-mixed-progress-v3-milestone-s1"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "report.json").write_text('{"wall_seconds": 1.0}')
    monkeypatch.setattr(bench, "part_model", lambda *a, **k: pytest.fail("the PRM was trained again"))
    monkeypatch.setattr(bench, "metrics", lambda run: [])
    monkeypatch.setattr(bench, "evals", lambda rows: curve)
    monkeypatch.setattr(bench, "prm_reward", lambda *a: None)
    row = bench.part_prm(1, tmp_path, 200, 10, 1.0, 8, name="progress-v3", mode="milestone")
    assert row["prm_model"] == recorded
    bench.model_row_path("progress-v3", 1, tmp_path).unlink()  # a model from before rows were recorded
    assert bench.part_prm(1, tmp_path, 200, 10, 1.0, 8, name="progress-v3", mode="milestone")["prm_model"] is None


def test_longer_runs_are_named_by_length_and_one_arm_runs_alone(monkeypatch, tmp_path):
    assert bench.sparse_run(Path("o"), 2, norm=False, iterations=400).name == "prm-sparse-nonorm-it400-s2"
    assert bench.sparse_run(Path("o"), 2, iterations=200).name == "prm-sparse-s2"
    assert bench.mixed_run(Path("o"), 2, "progress-v3", "milestone", 0.5, 0.0, norm=False, iterations=400).name \
        == "prm-mixed-progress-v3-milestone-w0.5-a0-nonorm-it400-s2"
    ran = []

    def fake_run(seed, run, reward, iterations, eval_every, **kw):
        ran.append((run.name, iterations, sorted(p.name for p in run.iterdir()) if run.exists() else None))
        (run / "checkpoints").mkdir(parents=True, exist_ok=True)
        (run / "checkpoints" / f"iter_{iterations:06d}").write_text("")
        (run / "report.json").write_text('{"wall_seconds": 1.0}')

    (tmp_path / "progress-v3-s2").mkdir()
    (tmp_path / "progress-v3-s2" / "config.json").write_text("{}")
    monkeypatch.setattr(bench, "quickstart_run", fake_run)
    monkeypatch.setattr(bench, "pretrained", lambda seed, out, start: out)
    monkeypatch.setattr(bench, "prm_reward", lambda *a: None)
    args = dict(name="progress-v3", mode="milestone", anneal=0.0, norm=False)
    # the sparse arm alone, extending its 200-iteration run: that run first, then a copy of it resumed to 400
    assert bench.part_prm(2, tmp_path, 400, 40, 0.5, 8, **args, arms=("sparse",), extend=200) is None
    assert ran == [("prm-sparse-nonorm-s2", 200, None), ("prm-sparse-nonorm-it400-s2", 400, ["checkpoints"])]
    assert (tmp_path / "prm-sparse-nonorm-s2" / "report.json").exists()  # the shorter run stays as it was
    assert sorted(p.name for p in (tmp_path / "prm-sparse-nonorm-it400-s2" / "checkpoints").iterdir()) == \
        ["iter_000200", "iter_000400"]
    ran.clear()
    assert bench.part_prm(2, tmp_path, 400, 40, 0.5, 8, **args, arms=("prm",)) is None
    assert ran == [("prm-mixed-progress-v3-milestone-w0.5-a0-nonorm-it400-s2", 400, None)]
    with pytest.raises(ValueError, match="--extend_sparse 300"):
        bench.part_prm(3, tmp_path, 400, 40, 0.5, 8, **args, arms=("sparse",), extend=300)
    ran.clear()  # a seed whose PRM is not trained yet: its sparse arm alone runs without training it
    monkeypatch.setattr(bench, "part_model", lambda *a, **k: pytest.fail("the sparse arm trained the PRM"))
    assert bench.part_prm(4, tmp_path, 200, 40, 0.5, 8, **args, arms=("sparse",)) is None
    assert ran == [("prm-sparse-nonorm-s4", 200, None)]


def test_every_prm_section_is_read_together_counting_only_rows_whose_sparse_run_improved():
    def row(improved, ratio, mixed_final=0.5):
        return {"sparse_improved": improved, "step_ratio": ratio, "sparse_final": 0.4, "mixed_final": mixed_final}

    results = {"prm": {"seeds": {"0": row(True, 0.5), "1": row(False, 0.2), "2": row(True, float("nan"))}},
               "prm (late, session 9)": {"seeds": {"0": row(True, 0.8), "1": row(True, 0.4, mixed_final=0.1)}},
               "classifier": {"seeds": {"0": {"episode_accuracy": 1.0}}}}
    per_section, total = bench.prm_summary(results)
    assert [(s["section"], s["seeds"], s["readable"], s["met"]) for s in per_section] == [
        ("prm", 3, 2, 1), ("prm (late, session 9)", 2, 2, 0)]  # 0.4 but collapsed below the sparse final: not met
    assert total["readable"] == 4 and total["met"] == 1 and total["never"] == 1
    assert total["median_ratio"] == pytest.approx(0.65)  # of 0.4, 0.5, 0.8 and never (above every ratio)
    table = "\n".join(bench.render_prm_summary(results))
    assert "| prm | 3 | 2 | 1 | s0 0.50, s2 - |" in table
    assert "| **all** | 5 | 4 | 1 | median 0.65; 1 never reached |" in table
    assert bench.render_prm_summary({"classifier": results["classifier"]}) == []


def test_a_prm_weight_that_fades_early_is_named_by_when_and_reaches_its_final_weight_there():
    assert bench.mixed_run(Path("o"), 2, "progress-v3", "milestone", 0.5, 0.0, norm=False, iterations=400,
                           anneal_end=0.5).name == "prm-mixed-progress-v3-milestone-w0.5-a0-e0.5-nonorm-it400-s2"
    assert bench.mixed_run(Path("o"), 2, "progress-v3", "milestone", 0.5, 0.0, anneal_end=1.0).name \
        == "prm-mixed-progress-v3-milestone-w0.5-a0-s2"
    reward = bench.prm_reward(Path("p"), 0.5, "milestone", 0.0, 0.5)
    assert dict(reward.weights(0.25))["prm"] == pytest.approx(0.25)
    assert dict(reward.weights(0.5))["prm"] == 0.0 and dict(reward.weights(0.9))["prm"] == 0.0
    assert dict(bench.prm_reward(Path("p"), 0.5, "milestone", 0.0).weights(0.5))["prm"] == pytest.approx(0.25)
