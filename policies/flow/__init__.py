"""Flow-matching policies: Flow-SDE math, the shared sampler loop, value heads, the latent-noise
actor, the FlowPolicy base.

Importing this package is cheap (no LeRobot import); the LeRobot adapters live
in :mod:`policies.flow.lerobot` (registered as ``pi0``, ``pi05``, ``smolvla``) and
import LeRobot lazily.
"""

from policies.flow.latent import LatentNoiseActor
from policies.flow.policy import FlowContext, FlowHeadDims, FlowPolicy
from policies.flow.sampler import (
    ChainReduce,
    NoiseNet,
    SamplerConfig,
    SamplerKind,
    SdeMode,
    VelocityOutput,
    chain_log_prob,
    sample_chain,
)
from policies.flow.sde import flow_sde_step
from policies.flow.value import ValueHead, ValuePlacement

__all__ = [
    "ChainReduce", "FlowContext", "FlowHeadDims", "FlowPolicy", "LatentNoiseActor", "NoiseNet", "SamplerConfig", "SamplerKind",
    "SdeMode", "ValueHead", "ValuePlacement", "VelocityOutput", "chain_log_prob", "flow_sde_step", "sample_chain",
]
