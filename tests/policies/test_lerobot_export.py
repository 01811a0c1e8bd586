"""A pi0 / pi0.5 / SmolVLA checkpoint saved by vla-rl loads in LeRobot's own ``from_pretrained`` and acts the same.

Each tiny model is fine-tuned a little first (new normalization statistics, a few SFT steps, a Flow-Noise head),
so the check would catch weights or statistics that did not travel.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lerobot.policies.pi0", reason="LeRobot with the [pi,smolvla] extras is not installed")

from safetensors import safe_open  # noqa: E402

from policies.base import ActMode  # noqa: E402
from policies.flow.lerobot import LeRobotFlowPolicy  # noqa: E402
from policies.flow.sampler import SamplerConfig, SamplerKind  # noqa: E402
from policies.flow.tiny import build_tiny_lerobot_policy, tiny_paligemma_configs  # noqa: E402
from policies.loading import load_policy  # noqa: E402

torch.set_num_threads(1)
KINDS = ["pi0", "pi05", "smolvla"]
B, H, A, A_MODEL, S = 2, 4, 3, 8, 5
LEROBOT_STEPS = 10  # LeRobot's default num_inference_steps (pi0, pi0.5) / num_steps (SmolVLA)
ATOL = 1e-6  # same code on identical weights: measured difference 0.0; 1e-6 allows for kernel reordering
DOC = Path(__file__).resolve().parents[2] / "docs" / "policies.md"


def lerobot_class(kind: str) -> type:
    from lerobot.policies.pi0 import PI0Policy
    from lerobot.policies.pi05 import PI05Policy
    from lerobot.policies.smolvla import SmolVLAPolicy

    return {"pi0": PI0Policy, "pi05": PI05Policy, "smolvla": SmolVLAPolicy}[kind]


def make_obs(seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {
        "observation.images.front": torch.randint(0, 256, (B, 64, 64, 3), dtype=torch.uint8, generator=g),
        "observation.state": torch.randn(B, S, generator=g),
        "task": ["pick up the red cube", "open the drawer"],
    }


def lerobot_batch(obs: dict[str, Any]) -> dict[str, Any]:
    """The observation as a LeRobot user feeds it: float images ``[B, 3, H, W]`` in [0, 1]."""
    image = obs["observation.images.front"].permute(0, 3, 1, 2).float() / 255.0
    return {"observation.images.front": image, "observation.state": obs["observation.state"], "task": obs["task"]}


def fine_tuned(kind: str, vlm_folder: Path) -> LeRobotFlowPolicy:
    """A tiny policy whose weights and statistics differ from a fresh build: refit stats, 3 SFT steps, Flow-Noise."""
    torch.manual_seed(0)
    policy = build_tiny_lerobot_policy(kind, vlm_folder=vlm_folder)
    g = torch.Generator().manual_seed(1)
    policy.fit_normalization(torch.randn(64, S, generator=g) * 2 + 1, torch.randn(64, H, A, generator=g) * 3 - 1)
    before = policy.lerobot.model.action_out_proj.weight.detach().clone()
    optimizer = torch.optim.Adam(policy.lerobot.parameters(), lr=1e-2)
    for step in range(3):
        optimizer.zero_grad()
        policy.sft_loss(make_obs(seed=10 + step), torch.randn(B, H, A, generator=g)).backward()
        optimizer.step()
    assert float((policy.lerobot.model.action_out_proj.weight.detach() - before).abs().max()) > 1e-3  # SFT moved it
    policy.configure_sampler(SamplerConfig(kind=SamplerKind.FLOW_NOISE, num_steps=LEROBOT_STEPS))
    return policy


def load_in_lerobot(kind: str, folder: Path) -> tuple[Any, Any, Any]:
    """LeRobot's own loaders only: ``<Policy>.from_pretrained`` and ``make_pre_post_processors``."""
    from lerobot.policies.factory import make_pre_post_processors
    from transformers import AutoTokenizer

    with tiny_paligemma_configs():  # tiny Gemma sizes; real checkpoints need no context
        policy = lerobot_class(kind).from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder / "tokenizer")
    overrides = {"tokenizer_processor": {"tokenizer": tokenizer}}
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(folder), preprocessor_overrides=overrides)
    return policy, pre, post


def processor_state(pipeline: Any) -> dict[str, torch.Tensor]:
    """Every tensor the pipeline's steps hold (the normalization statistics), keyed by step index and name."""
    return {f"{i}.{k}": v for i, step in enumerate(pipeline.steps) for k, v in step.state_dict().items()}


@pytest.fixture(scope="module")
def vlm_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-smolvlm")


@pytest.mark.parametrize("kind", KINDS)
def test_lerobot_from_pretrained_loads_a_vla_rl_checkpoint(vlm_folder: Path, kind: str, tmp_path: Path) -> None:
    ours = fine_tuned(kind, vlm_folder)
    folder = tmp_path / kind
    ours.save_pretrained(folder)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:  # LeRobot's weights only; our heads elsewhere
        assert not [k for k in f.keys() if k.startswith(("value_head", "noise_net"))]

    lerobot, pre, post = load_in_lerobot(kind, folder)
    assert type(lerobot) is type(ours.lerobot)
    steps = lerobot.config.num_steps if kind == "smolvla" else lerobot.config.num_inference_steps
    assert steps == LEROBOT_STEPS  # our ODE above uses the same count
    mine, theirs = ours.lerobot.state_dict(), lerobot.state_dict()
    assert set(mine) == set(theirs)
    for key, value in mine.items():
        torch.testing.assert_close(theirs[key], value, rtol=0, atol=0, msg=key)
    for a, b in ((ours.preprocessor, pre), (ours.postprocessor, post)):
        want, got = processor_state(a), processor_state(b)
        assert want and set(got) == set(want)
        for key, value in want.items():
            torch.testing.assert_close(got[key], value, rtol=0, atol=0, msg=key)

    obs = make_obs(seed=3)
    noise = torch.randn(B, H, A_MODEL, generator=torch.Generator().manual_seed(4))
    expected = ours.act(obs, ActMode.EVAL, noise=noise).actions
    with torch.no_grad():
        actions = post(lerobot.predict_action_chunk(pre(lerobot_batch(obs)), noise=noise))
    assert actions.shape == (B, H, A)
    torch.testing.assert_close(actions, expected, rtol=0, atol=ATOL)

    with tiny_paligemma_configs():  # and vla-rl still loads it, RL heads and sampler included
        again = load_policy(folder)
    assert again.sampler.kind is SamplerKind.FLOW_NOISE
    torch.manual_seed(5)
    explore = ours.act(obs, ActMode.EXPLORE)
    torch.manual_seed(5)
    explore_again = again.act(obs, ActMode.EXPLORE)
    for field in ("actions", "logp", "value"):
        torch.testing.assert_close(getattr(explore_again, field), getattr(explore, field), rtol=0, atol=0)


def test_the_documented_lerobot_snippet_runs(vlm_folder: Path, tmp_path: Path) -> None:
    """The ``python`` block of docs/policies.md's "Loading a vla-rl checkpoint in LeRobot", on a tiny pi0."""
    section = DOC.read_text().split("## Loading a vla-rl checkpoint in LeRobot", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code, f"{DOC}: no python block in the LeRobot loading section"
    folder = tmp_path / "pi0"
    fine_tuned("pi0", vlm_folder).save_pretrained(folder)
    source = code.group(1).replace('"outputs/pi0-rl/policy"', repr(str(folder)))
    assert repr(str(folder)) in source
    scope: dict[str, Any] = {}
    with tiny_paligemma_configs():
        exec(compile(source, str(DOC), "exec"), scope)  # noqa: S102  (our own documentation)
    assert scope["actions"].shape == (1, H, A) and torch.isfinite(scope["actions"]).all()

