"""Checkpoints that verify: damaged files are named, resume falls back, nothing damaged is deleted,
bad inputs stop with one line and exit code 2."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from policies.io import CheckpointError
from policies.loading import load_policy
from vla_core.manifest import MANIFEST, IntegrityError, verify_manifest
from vla_rl import checkpoint as ckpt
from vla_rl.cli import run
from vla_rl.faults.scenarios import save as _save
from vla_rl.faults.scenarios import tiny_policy as _policy


def _truncate(path: Path, size: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:size])


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_every_file_is_in_the_manifest_and_a_sound_checkpoint_verifies(tmp_path: Path) -> None:
    folder = _save(tmp_path, 1)
    files = json.loads((folder / MANIFEST).read_text())["files"]
    assert {"trainer.pt", "config.json", "policy/config.json", "policy/model.safetensors",
            f"policy/{MANIFEST}"} <= set(files)
    assert ckpt.verify_checkpoint(folder) is True
    assert (tmp_path / "latest").read_text() == "iter_000001"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_truncated_trainer_pt_is_skipped_with_one_line_naming_it(tmp_path: Path) -> None:
    first, second = _save(tmp_path, 1), _save(tmp_path, 2)
    size = (second / "trainer.pt").stat().st_size
    _truncate(second / "trainer.pt", 100)
    lines: list[str] = []
    assert ckpt.resume_checkpoint(tmp_path, report=lines.append) == first
    assert lines == [f"skipping checkpoints/iter_000002: trainer.pt has 100 bytes, the manifest says {size}"
                     .replace("checkpoints/", f"{tmp_path.name}/")]
    assert second.exists()  # never deleted


def test_empty_policy_weights_are_skipped_with_one_line_naming_them(tmp_path: Path) -> None:
    first, second = _save(tmp_path, 1), _save(tmp_path, 2)
    (second / "policy" / "model.safetensors").write_bytes(b"")
    lines: list[str] = []
    assert ckpt.resume_checkpoint(tmp_path, report=lines.append) == first
    assert len(lines) == 1 and "iter_000002: policy/model.safetensors has 0 bytes, the manifest says" in lines[0]


def test_a_flipped_bit_is_detected_by_the_manifest(tmp_path: Path) -> None:
    folder = _save(tmp_path, 1)
    weights = folder / "policy" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x01  # same size, one bit of a tensor changed
    weights.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="model.safetensors does not match its sha256 in the manifest"):
        verify_manifest(folder)
    with pytest.raises(CheckpointError, match="model.safetensors does not match its sha256"):
        ckpt.verify_checkpoint(folder)
    with pytest.raises(CheckpointError, match="model.safetensors does not match its sha256"):
        load_policy(folder / "policy")  # the policy folder's own manifest catches it too
    assert verify_manifest(folder, hashes=False)  # sizes alone cannot see it


def test_resume_falls_back_to_the_previous_checkpoint_end_to_end(tmp_path: Path, capsys) -> None:
    from tests.vla_rl.test_train import TINY

    args = ["train", *TINY, "--env.obs_mode", "state", "--env.num_workers", "0", "--checkpoint_every", "1",
            "--run_dir", str(tmp_path / "run")]
    run([*args, "--iterations", "2"])
    ckpts = tmp_path / "run" / "checkpoints"
    _truncate(ckpts / "iter_000002" / "trainer.pt", 1024)
    capsys.readouterr()
    run([*args, "--iterations", "3", "--resume", "true"])
    out = capsys.readouterr().out
    assert "skipping checkpoints/iter_000002: trainer.pt has 1024 bytes, the manifest says" in out
    assert "at iteration 1 from" in out
    assert (ckpts / "iter_000002.damaged-1" / "trainer.pt").stat().st_size == 1024  # moved aside, kept
    assert ckpt.verify_checkpoint(ckpts / "iter_000003") and (ckpts / "latest").read_text() == "iter_000003"


def test_a_checkpoint_without_manifest_still_loads_unverified(tmp_path: Path) -> None:
    folder = _save(tmp_path, 1)
    (folder / MANIFEST).unlink()
    (folder / "policy" / MANIFEST).unlink()
    random.seed(3)
    np.random.seed(3)
    legacy_rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save({"learner": {}, "rng": legacy_rng, "iteration": 1, "env_steps": 10}, folder / "trainer.pt")
    lines: list[str] = []
    assert ckpt.resume_checkpoint(tmp_path, report=lines.append) == folder
    assert len(lines) == 1 and "has no manifest.json" in lines[0] and "unverified" in lines[0]
    state = ckpt.load_trainer_state(folder)  # weights_only=True, with the old numpy RNG tuple allowed
    expected = np.random.rand(3)
    ckpt.set_rng_state(state["rng"])
    assert np.array_equal(np.random.rand(3), expected)
    load_policy(folder / "policy")
    # without a manifest, a truncated weights file is still caught, from its header
    weights = folder / "policy" / "model.safetensors"
    size = weights.stat().st_size
    _truncate(weights, size - 100)
    with pytest.raises(CheckpointError, match=f"model.safetensors has {size - 100} bytes, its safetensors header "
                                              f"says {size}: truncated"):
        load_policy(folder / "policy")
    assert ckpt.resume_checkpoint(tmp_path, report=lines.append) is None


def test_rng_state_round_trips_through_a_weights_only_load(tmp_path: Path) -> None:
    np.random.seed(5)
    np.random.randn()  # a cached Gaussian in the numpy state
    _save(tmp_path, 1)
    expected = (random.random(), np.random.randn(3), torch.rand(3))
    ckpt.set_rng_state(ckpt.load_trainer_state(tmp_path / "iter_000001")["rng"])
    got = (random.random(), np.random.randn(3), torch.rand(3))
    assert got[0] == expected[0] and np.array_equal(got[1], expected[1]) and torch.equal(got[2], expected[2])


def test_a_failed_write_leaves_the_previous_checkpoint_and_latest(tmp_path: Path, monkeypatch) -> None:
    first = _save(tmp_path, 1)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        _save(tmp_path, 2)
    monkeypatch.undo()
    assert (tmp_path / "latest").read_text() == "iter_000001"
    assert ckpt.verify_checkpoint(first) and not (tmp_path / "iter_000002").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert ckpt.resume_checkpoint(tmp_path) == first


def test_pruning_keeps_damaged_checkpoints_and_does_not_count_them(tmp_path: Path) -> None:
    for it in (1, 2, 3):
        _save(tmp_path, it, keep_last=2)
    assert [p.name for p in ckpt.checkpoints(tmp_path)] == ["iter_000003", "iter_000002"]
    (tmp_path / "iter_000003" / "config.json").write_text("{}")  # damaged
    _save(tmp_path, 4, keep_last=2)
    # kept: 4 and 2 (sound, the newest two); 3 is damaged: not counted, not deleted
    assert [p.name for p in ckpt.checkpoints(tmp_path)] == ["iter_000004", "iter_000003", "iter_000002"]


def test_a_damaged_best_is_ignored_and_moved_aside(tmp_path: Path) -> None:
    first = _save(tmp_path, 1)
    ckpt.mark_best(tmp_path, first, 0.5)
    assert ckpt.best_metric(tmp_path) == 0.5 and ckpt.verify_checkpoint(tmp_path / "best")
    (tmp_path / "best" / "trainer.pt").write_bytes(b"")
    lines: list[str] = []
    assert ckpt.best_metric(tmp_path, report=lines.append) is None
    assert lines == [f"ignoring {tmp_path.name}/best: trainer.pt has 0 bytes, the manifest says "
                     f"{(first / 'trainer.pt').stat().st_size}"]
    ckpt.mark_best(tmp_path, _save(tmp_path, 2), 0.7, report=lines.append)
    assert ckpt.best_metric(tmp_path) == 0.7 and (tmp_path / "best.damaged-1").is_dir()


def test_sft_policy_folders_carry_a_manifest_that_lists_sft_json(tmp_path: Path) -> None:
    from vla_rl.algorithms.sft import save_sft_policy

    out = save_sft_policy(_policy(), tmp_path / "sft", {"sft/steps": 1})
    assert verify_manifest(out)
    assert "sft.json" in json.loads((out / MANIFEST).read_text())["files"]


def test_a_policy_folder_with_truncated_weights_stops_with_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "policy"
    _policy().save_pretrained(folder)
    _truncate(folder / "model.safetensors", 7)
    with pytest.raises(SystemExit) as exc:
        run(["rollout", "--env.id", "mujoco/pick-red", "--policy", str(folder)])
    assert exc.value.code == 2
    err = _one_error_line(capsys)
    assert f"{folder / 'model.safetensors'} has 7 bytes, the manifest says" in err and "SafetensorError" not in err
    from tests.vla_rl.test_train import TINY

    with pytest.raises(SystemExit) as exc:
        run(["train", *TINY, "--env.obs_mode", "state", "--env.num_workers", "0", "--policy.path", str(folder),
             "--run_dir", str(tmp_path / "run")])
    assert exc.value.code == 2 and "model.safetensors has 7 bytes" in _one_error_line(capsys)


def test_malformed_config_json_names_the_file_and_line(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "policy"
    _policy().save_pretrained(folder)
    (folder / MANIFEST).unlink()  # a hand-edited folder: its manifest would name the file anyway
    (folder / "config.json").write_text('{\n  "type": "compact-flow",\n  "width": 32,,\n}\n')
    with pytest.raises(CheckpointError, match=r"config.json: not valid JSON \(line 3, column"):
        load_policy(folder)
    with pytest.raises(SystemExit) as exc:
        run(["rollout", "--env.id", "mujoco/pick-red", "--policy", str(folder)])
    assert exc.value.code == 2 and f"{folder / 'config.json'}: not valid JSON (line 3" in _one_error_line(capsys)


def test_a_policy_that_is_neither_a_name_nor_a_folder(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        run(["rollout", "--env.id", "mujoco/pick-red", "--policy", "nonsense"])
    assert exc.value.code == 2
    assert "unknown policy name 'nonsense'. Known names: random, expert; a policy folder is given by its path" in (
        _one_error_line(capsys))


def test_a_missing_policy_path_is_one_sentence_and_debug_shows_the_traceback(tmp_path: Path, capsys,
                                                                               monkeypatch) -> None:
    args = ["train", "--policy.path", str(tmp_path / "nope"), "--run_dir", str(tmp_path / "run")]
    with pytest.raises(SystemExit) as exc:
        run(args)
    assert exc.value.code == 2
    assert f"policy.path: {tmp_path / 'nope'} is not a folder" in _one_error_line(capsys)
    from vla_rl.config import ConfigError

    with pytest.raises(ConfigError):
        run([*args, "--debug"])
    monkeypatch.setenv("VLA_RL_DEBUG", "1")
    with pytest.raises(ConfigError):
        run(args)


def test_a_preset_that_is_not_yaml_names_the_file_and_line(tmp_path: Path, capsys) -> None:
    preset = tmp_path / "bad.yaml"
    preset.write_text("env:\n  id: mujoco/pick-red\n  num_envs: [2\n")
    with pytest.raises(SystemExit) as exc:
        run(["rollout", "--config_path", str(preset)])
    assert exc.value.code == 2
    err = _one_error_line(capsys)
    assert str(preset) in err and "line" in err and "not valid YAML" in err
