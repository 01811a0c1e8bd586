"""``--eval.ema``: the moving average of the RL weights that is evaluated and checkpointed (:mod:`vla_rl.ema`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from vla_rl.config import ConfigError
from vla_rl.ema import WeightEMA, check_ema_resume


def _net(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).to(dtype)
    net[1].bias.requires_grad_(False)  # frozen: not averaged
    return net


def _trainable(net: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters() if p.requires_grad]


def test_the_average_follows_its_recurrence_and_applies_only_inside():
    net, decay = _net(), 0.75
    expected = _trainable(net)
    ema = WeightEMA(net, decay)
    assert len(ema.params) == 3  # the frozen bias is left out
    for step in range(3):
        with torch.no_grad():
            for p in net.parameters():
                p.add_(0.1 * (step + 1))
        ema.update()
        expected = [decay * e + (1 - decay) * p for e, p in zip(expected, _trainable(net))]
    trained = _trainable(net)
    with ema.applied():
        inside = _trainable(net)
        saved = ema.state_dict()
    assert all(torch.allclose(a, e) for a, e in zip(inside, expected))
    assert not any(torch.allclose(a, t) for a, t in zip(inside, trained))
    assert all(torch.equal(a, t) for a, t in zip(_trainable(net), trained)), "the weights as trained came back"
    assert all(torch.equal(s, t) for s, t in zip(saved["trained"], trained)), "trainer.pt gets the weights as trained"
    assert saved["updates"] == 3 and saved["decay"] == decay

    with pytest.raises(RuntimeError, match="boom"), ema.applied():
        raise RuntimeError("boom")
    assert all(torch.equal(a, t) for a, t in zip(_trainable(net), trained))


def test_a_bf16_policy_is_averaged_in_float32():
    """Steps of 1 - decay below bf16's resolution still add up (a bf16 average would stay where it started)."""
    net = _net(torch.bfloat16)
    start = [p.float() for p in _trainable(net)]
    ema = WeightEMA(net, 0.999)
    with torch.no_grad():
        for p in ema.params:
            p.add_(1.0)
    for _ in range(100):
        ema.update()
    moved = [(s - a).mean().item() for s, a in zip(ema.shadow, start)]
    assert all(0.08 < m < 0.11 for m in moved), moved  # 1 - 0.999 ** 100 = 0.095


def test_resume_restores_the_weights_as_trained_and_refuses_a_switched_average(tmp_path):
    net = _net()
    ema = WeightEMA(net, 0.5)
    with torch.no_grad():
        for p in ema.params:
            p.mul_(2.0)
    ema.update()
    with ema.applied():
        averaged, state = _trainable(net), ema.state_dict()
    trained = _trainable(net)

    loaded = _net()  # as load_policy gives it: the policy folder's weights, the average
    with torch.no_grad():
        for p, a in zip([p for p in loaded.parameters() if p.requires_grad], averaged):
            p.copy_(a)
    back = WeightEMA(loaded, 0.9)  # as the trainer builds it on the loaded policy, then resumes it
    back.load_state_dict(state)
    assert back.updates == 1 and back.decay == 0.9
    assert all(torch.equal(a, t) for a, t in zip(_trainable(loaded), trained))
    assert all(torch.equal(s, a) for s, a in zip(back.shadow, averaged))

    check_ema_resume(0.0, None, tmp_path)
    check_ema_resume(0.9, state, tmp_path)  # the decay may change
    with pytest.raises(ConfigError, match=r"trainer\.pt holds a run with eval\.ema=0\.5"):
        check_ema_resume(0.0, state, tmp_path)
    with pytest.raises(ConfigError, match=r"trainer\.pt holds a run without eval\.ema.*--eval\.ema 0"):
        check_ema_resume(0.9, None, tmp_path)
    with pytest.raises(ValueError, match="do not match"):
        WeightEMA(torch.nn.Linear(2, 2), 0.9).load_state_dict(state)


def test_a_training_run_checkpoints_the_average_and_resumes_it_exactly(tmp_path):
    """Through ``vla-rl train``: each checkpoint's policy folder is ``decay * previous + (1 - decay) * trained`` with
    the weights as trained from its ``trainer.pt``, and a run resumed mid-way writes the same last checkpoint."""
    from safetensors.torch import load_file

    from policies.loading import load_policy
    from vla_rl.cli import parse_config
    from vla_rl.train_config import TrainConfig
    from vla_rl.trainer import Trainer

    from .test_train import TINY

    decay = 0.5
    args = [*TINY, "--iterations", "3", "--eval.ema", str(decay), "--keep_last", "5", "--eval.every", "1"]
    straight = tmp_path / "straight"
    torch.set_num_threads(1)
    Trainer(parse_config(TrainConfig, [*args, "--run_dir", str(straight)])).run()

    ckpts = [straight / "checkpoints" / f"iter_{k:06d}" for k in (1, 2, 3)]
    names = [n for n, p in load_policy(ckpts[0] / "policy").named_parameters() if p.requires_grad]
    for prev, cur in zip(ckpts, ckpts[1:]):
        before, after = load_file(prev / "policy" / "model.safetensors"), load_file(cur / "policy" / "model.safetensors")
        trained = torch.load(cur / "trainer.pt", weights_only=True)["ema"]["trained"]
        assert len(trained) == len(names)
        for name, t in zip(names, trained):
            assert torch.allclose(after[name], decay * before[name] + (1 - decay) * t, atol=1e-6), (cur.name, name)
        assert any(not torch.equal(after[n], t) for n, t in zip(names, trained)), "the folder holds the trained weights"

    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    for k in (2, 3):
        shutil.rmtree(resumed / "checkpoints" / f"iter_{k:06d}")
    Trainer(parse_config(TrainConfig, [*args, "--run_dir", str(resumed), "--resume", "true"])).run()
    a = load_file(ckpts[-1] / "policy" / "model.safetensors")
    b = load_file(resumed / "checkpoints" / "iter_000003" / "policy" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    ta = torch.load(ckpts[-1] / "trainer.pt", weights_only=True)["ema"]["trained"]
    tb = torch.load(resumed / "checkpoints" / "iter_000003" / "trainer.pt", weights_only=True)["ema"]["trained"]
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(ta, tb))

    with pytest.raises(ConfigError, match="eval.ema"):  # the same run resumed without the average
        Trainer(parse_config(TrainConfig, [*TINY, "--iterations", "4", "--run_dir", str(resumed),
                                           "--resume", "true"])).run()


def test_eval_ema_outside_0_1_fails_at_parse_time(capsys):
    from vla_rl.cli import parse_config
    from vla_rl.train_config import TrainConfig

    with pytest.raises(SystemExit):
        parse_config(TrainConfig, ["--eval.ema", "1.0"])
    assert "eval.ema" in capsys.readouterr().err
