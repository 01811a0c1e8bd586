"""Dump a fixed-seed rollout of the quickstart's setting (compact Flow-SDE policy on ``mujoco/pick-any``).

Used to check that the reward seam (``rewards.RewardConfig``) leaves the chunk rewards fed to GAE bit-identical: run
it on the code before and after a change and compare the two files with ``--compare``::

    python scripts/reward_identity.py /tmp/before.pt          # on the old code
    python scripts/reward_identity.py /tmp/after.pt           # on the new code
    python scripts/reward_identity.py /tmp/after.pt --compare /tmp/before.pt

Three runs: in-process envs, two worker processes (``step_chunk`` in the workers) and pipelined
collection on the workers. Each saves ``rewards``, ``terminated``, ``truncated``, ``next_values``
and the episodes' returns and lengths.
"""

from __future__ import annotations

import argparse
import sys

import torch

from policies.base import ActMode
from policies.compact import CompactFlowConfig, CompactFlowPolicy, TextEncoderKind
from policies.flow.sampler import SamplerConfig, SamplerKind, SdeMode
from sim.registry import make_env
from vla_rl.rollout import RolloutEngine


def collect(num_workers: int, pipelined: bool) -> dict[str, torch.Tensor]:
    """8 decisions of 4 envs from seed 0; the tensors to compare."""
    env = make_env("mujoco/pick-any", num_envs=4, seed=0, obs_mode="rgb", image_size=32, wrist_camera=True,
                   max_episode_steps=10, num_workers=num_workers)
    try:
        spec = env.spec
        torch.manual_seed(0)
        cfg = CompactFlowConfig(
            cameras=("front", "wrist"), image_size=(32, 32), state_dim=spec.observation["observation.state"].shape[0],
            action_dim=spec.action_dim, chunk_size=4, width=32, heads=2, expert_layers=1, cnn_channels=(8, 16),
            image_tokens=2, text_encoder=TextEncoderKind.HASHED, text_buckets=64, value_hidden=16, noise_hidden=16,
            sampler=SamplerConfig(kind=SamplerKind.FLOW_SDE, sde_mode=SdeMode.FULL_CHAIN, num_steps=3),
        )
        policy = CompactFlowPolicy(cfg)
        engine = RolloutEngine(env, policy, exec_steps=3, pipelined=pipelined)
        engine.reset(seed=0)
        ro = engine.collect(8, ActMode.EXPLORE)
        ro2 = engine.collect(4, ActMode.EXPLORE)
        return {
            "rewards": torch.cat([ro.rewards, ro2.rewards]), "terminated": torch.cat([ro.terminated, ro2.terminated]),
            "truncated": torch.cat([ro.truncated, ro2.truncated]),
            "next_values": torch.cat([ro.next_values, ro2.next_values]),
            "ep_return": torch.tensor([e.ret for e in ro.episodes + ro2.episodes], dtype=torch.float64),
            "ep_length": torch.tensor([e.length for e in ro.episodes + ro2.episodes]),
        }
    finally:
        env.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--compare", default="")
    args = parser.parse_args()
    runs = {"serial": collect(0, False), "workers": collect(2, False), "pipelined": collect(2, True)}
    torch.save(runs, args.out)
    for name, run in runs.items():
        r = run["rewards"]
        print(f"{name}: rewards {list(r.shape)} sum {float(r.double().sum()):.9f} nonzero {int((r != 0).sum())} "
              f"episodes {len(run['ep_length'])} ends {int((run['terminated'] | run['truncated']).sum())}")
    if not args.compare:
        return 0
    old = torch.load(args.compare)
    ok = True
    for name, run in runs.items():
        for key, value in run.items():
            same = value.dtype == old[name][key].dtype and torch.equal(value, old[name][key])
            ok &= same
            print(f"{name}/{key}: {'bit-identical' if same else 'DIFFERS'}")
    print("ALL BIT-IDENTICAL" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
