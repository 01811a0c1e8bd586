"""One clear line per bad input, for every command: malformed YAML names the file and line, a bad env id or
option exits 2 (not 1, which means a failure at run time), unknown policy names and missing policy folders are
told apart, malformed JSON names the file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from vla_rl.cli import run
from vla_rl.commands import COMMANDS

BAD_YAML = "env:\n  id: mujoco/pick-red\n  num_envs: [1\nseed: 3\n"  # the flow sequence never closes


def one_line(capsys: pytest.CaptureFixture[str], code: int, exc: pytest.ExceptionInfo) -> str:
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if line.strip()]
    assert exc.value.code == code, (exc.value.code, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _commands() -> list[str]:
    """Every command, and every subcommand of a group as ``"<group> <sub>"``."""
    from vla_rl.cli import _load_commands
    from vla_rl.commands import GROUPS

    _load_commands()
    names = [entry.name for entry in COMMANDS if entry.name not in GROUPS]
    names += [f"{group} {entry.name}" for group, subs in GROUPS.items() for entry in subs]
    return sorted(names)


@pytest.mark.parametrize("command", _commands())
def test_every_command_names_the_file_and_line_of_malformed_yaml(command: str, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_YAML)
    with pytest.raises(SystemExit) as exc:
        run([*command.split(), "--config_path", str(bad)])
    line = one_line(capsys, 2, exc)
    assert str(bad) in line and "line 4, column 5" in line, line


@pytest.mark.parametrize("command", ["train", "collect", "rollout"])
def test_an_unknown_env_id_is_bad_input(command: str, tmp_path: Path, capsys) -> None:
    extra = {"train": ["--run_dir", str(tmp_path / "run")], "collect": ["--output", str(tmp_path / "ds")],
             "rollout": ["--output_dir", str(tmp_path / "out")]}[command]
    with pytest.raises(SystemExit) as exc:
        run([command, "--env.id", "mujoco/pick-purple", *extra])
    line = one_line(capsys, 2, exc)
    assert line.startswith(f"vla-rl {command}: unknown env id 'mujoco/pick-purple'. Did you mean"), line
    assert not (tmp_path / "ds").exists()


def _env_with_a_bad_option():
    from sim import EnvConfigError

    raise EnvConfigError("toy/bad: option gain must be > 0, got -1")


@pytest.mark.slow  # starting a worker process takes 5-30 s on a loaded 2-core machine
def test_an_env_option_a_worker_rejects_is_bad_input_too() -> None:
    """An ``EnvConfigError`` raised inside a worker process stays an ``EnvConfigError`` (exit 2) and carries
    no worker traceback in its one line; any other worker error stays a runtime ``EnvError`` with it."""
    from sim import EnvConfigError
    from sim.vector_process import ProcessVecEnv

    with pytest.raises(EnvConfigError) as err:
        ProcessVecEnv([_env_with_a_bad_option] * 2, "toy/bad", num_workers=1)
    assert str(err.value) == "toy/bad: worker 0: toy/bad: option gain must be > 0, got -1"


@pytest.mark.parametrize("policy, message", [
    ("randm", "policy: unknown policy name 'randm'. Did you mean 'random'? Known names: random, expert"),
    ("./runs/nope/policy", "policy: the policy folder ./runs/nope/policy does not exist"),
    ("{file}", "policy: the policy folder {file} is a file, not a folder"),
])
def test_unknown_policy_names_and_paths_are_told_apart(policy: str, message: str, tmp_path: Path, capsys) -> None:
    file = tmp_path / "weights.bin"
    file.write_bytes(b"x")
    with pytest.raises(SystemExit) as exc:
        run(["rollout", "--env.id", "mujoco/pick-red", "--policy", policy.format(file=file)])
    assert message.format(file=file) in one_line(capsys, 2, exc)


def test_malformed_dataset_info_json_names_the_file_and_line(tmp_path: Path, capsys) -> None:
    from tests.vla_rl.test_data import write_lerobot_dataset

    root = write_lerobot_dataset(tmp_path / "ds", episodes=1, length=3)
    info = root / "meta" / "info.json"
    info.write_text(info.read_text().replace('"features"', '"features" "oops"', 1))
    capsys.readouterr()  # LeRobot's progress bars while writing the dataset
    with pytest.raises(SystemExit) as exc:
        run(["sft", "--dataset", str(root), "--output", str(tmp_path / "p")])
    line = one_line(capsys, 2, exc)
    assert f"{info}: not valid JSON (line " in line, line


def test_deploy_bad_input_exits_2_with_one_line(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        run(["deploy", "--robot.type", "mujoco_arm", "--policy.path", str(tmp_path / "nope")])
    line = one_line(capsys, 2, exc)
    assert line.startswith("vla-rl deploy: policy.path ") and "no config.json there" in line, line
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "config.json").write_text('{"type": "tiny-joint",\n "x": }')
    with pytest.raises(SystemExit) as exc:
        run(["deploy", "--robot.type", "mujoco_arm", "--policy.path", str(tmp_path / "p")])
    line = one_line(capsys, 2, exc)
    assert f"{tmp_path / 'p' / 'config.json'}: not valid JSON (line 2, column 7" in line, line
