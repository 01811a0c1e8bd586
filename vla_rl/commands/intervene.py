"""``vla-rl intervene``: run a policy in a sim env, let an operator take over, record labelled intervention data.

Every step is labelled ``policy``, ``recovery`` or ``correction`` and written
with LeRobot's ``intervention`` field to a new LeRobotDataset
(:mod:`vla_rl.intervention.session`). The operator is a person at a LeRobot
teleoperator (``--operator keyboard`` or ``gamepad``; keys ``t`` take over,
``m`` recovery -> correction, ``h`` hand back, ``s``/``f``/``n`` end the
episode, ``q`` quit, from the terminal or the camera window) or the simulated
operator (``--operator sim``, MuJoCo tabletop envs). On a robot the same
labels are recorded by ``vla-rl deploy``'s takeover (docs/hardware.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from vla_rl.commands import COMMANDS
from vla_rl.config import ConfigError, EnvConfig
from vla_rl.distributed import default_device
from vla_rl.intervention.operator import OperatorConfig

OPERATORS = ("sim", "keyboard", "gamepad")


@dataclass
class InterveneConfig:
    """``vla-rl intervene``: policy rollouts with operator takeovers, recorded as RaC data."""

    env: EnvConfig = field(default_factory=lambda: EnvConfig(id="mujoco/pick-place-stack", num_envs=1))
    policy: str = ""
    """Policy folder (``vla-rl sft`` / ``train`` output) or ``random``."""
    episodes: int = 10
    """Episodes to record."""
    output: str = ""
    """Dataset folder (must not exist); empty = ``data/<env id>-interventions-s<seed>``."""
    repo_id: str = "local/vla-rl-interventions"
    """Dataset name in its metadata (nothing is uploaded)."""
    operator: str = "sim"
    """``sim`` (simulated operator, any number of envs), ``keyboard`` (LeRobot ``keyboard_ee``) or ``gamepad``
    (LeRobot ``gamepad``); a person needs ``--env.num_envs 1``."""
    sim: OperatorConfig = field(default_factory=OperatorConfig)
    """The simulated operator's behaviour (``--operator sim``)."""
    teleop_scale: float = 1.0
    """Multiplies the teleoperator's deltas (action units per step)."""
    view: str = "none"
    """Camera view for the operator: ``window`` (OpenCV), ``file`` (``view_path`` PNG, updated every step), ``none``."""
    view_path: str = "intervene_view.png"
    """Frame file of ``view=file``."""
    exec_steps: int = 0
    """Actions of each policy chunk executed before re-planning (0 = the whole chunk)."""

    def __post_init__(self) -> None:
        if self.operator not in OPERATORS:
            raise ConfigError(f"operator must be one of {OPERATORS}, got {self.operator!r}")
        if self.operator != "sim" and self.env.num_envs != 1:
            raise ConfigError(f"operator={self.operator}: a person controls one env; pass --env.num_envs 1")
        if self.episodes < 1:
            raise ConfigError(f"episodes must be >= 1, got {self.episodes}")


def default_output(env_id: str, seed: int) -> Path:
    """``data/<env id with / as ->-interventions-s<seed>``."""
    return Path("data") / f"{env_id.replace('/', '-')}-interventions-s{seed}"


@COMMANDS.register("intervene", config=InterveneConfig,
                   help="run a policy with operator takeovers (teleop or simulated); record RaC-labelled data")
def intervene(cfg: InterveneConfig) -> dict:
    """Run the session and write the dataset; returns the session's statistics.

    Raises:
        ConfigError: for a missing policy folder, a non-tabletop env with ``--operator sim``.
        FileExistsError: when the output folder exists.
    """
    import torch

    from policies.base import ActMode
    from sim.dataset import EpisodeRecorder
    from vla_core.labels import label_features
    from vla_rl.intervention.session import TeleopController, make_operators, run_session
    from vla_rl.intervention.teleop import CameraView, LeRobotEETeleop, SessionKeys

    if not cfg.policy:
        raise ConfigError("policy: pass a policy folder (--policy runs/.../policy) or 'random'")
    if cfg.operator == "sim" and not cfg.env.id.startswith("mujoco/"):
        raise ConfigError(f"operator=sim watches the MuJoCo tabletop's privileged state; {cfg.env.id} is not "
                          "a mujoco/* env (use --operator keyboard or gamepad)")
    policy = None
    if cfg.policy != "random":
        if not Path(cfg.policy).is_dir():
            raise ConfigError(f"policy: {cfg.policy!r} is not a policy folder (config.json + model.safetensors)")
        from policies.io import checkpoint_cameras
        from policies.loading import load_policy

        policy = load_policy(cfg.policy).to(default_device())
        policy.eval()
        cfg = replace(cfg, env=cfg.env.with_policy_cameras(checkpoint_cameras(cfg.policy), cfg.policy))
    out = Path(cfg.output) if cfg.output else default_output(cfg.env.id, cfg.env.seed)
    keys = listener = source = None
    view = CameraView(cfg.view, cfg.view_path)
    with cfg.env.make() as env:
        gen = torch.Generator().manual_seed(cfg.env.seed)

        def act(obs: dict) -> torch.Tensor:
            if policy is None:
                return torch.rand((env.num_envs, 1, env.spec.action_dim), generator=gen) * 2 - 1
            return policy.act(obs, ActMode.EVAL).actions

        if cfg.operator == "sim":
            controllers = make_operators(cfg.sim, env.num_envs, cfg.sim.max_step, cfg.env.seed)
        else:
            from hardware.intervention import KeyboardListener

            keys = SessionKeys()
            source = LeRobotEETeleop(_teleop_config(cfg.operator), cfg.teleop_scale)
            controllers = [TeleopController(keys, source, env.spec.action_dim)]
            listener = KeyboardListener(keys)  # type: ignore[arg-type]  (duck-typed: handle_key)
            if not listener.start() and cfg.view != "window":
                print("intervene: no terminal for keys and no window: takeovers only through the camera window")
        rec = EpisodeRecorder(out, cfg.repo_id, env.spec, fps=round(env.spec.control_freq),
                              extra_features=label_features())
        try:
            stats = run_session(env, act, controllers, cfg.episodes, cfg.env.seed, recorder=rec,
                                exec_steps=cfg.exec_steps, view=view, keys=keys)
        finally:
            if listener is not None:
                listener.close()
            if source is not None:
                source.close()
            view.close()
        rec.finalize()
    summary = stats.as_dict()
    unfinished = f" (+{summary['cut']} unfinished, cut at the end)" if summary["cut"] else ""
    print(f"saved {summary['episodes']} episodes{unfinished} to {out}: success {summary['successes']}/"
          f"{summary['episodes']}, steps {summary['steps']}, {summary['takeovers']} episodes with a takeover")
    return summary


def _teleop_config(kind: str):  # noqa: ANN202  (a lerobot TeleoperatorConfig)
    if kind == "keyboard":
        from lerobot.teleoperators.keyboard.configuration_keyboard import KeyboardEndEffectorTeleopConfig

        return KeyboardEndEffectorTeleopConfig()
    from lerobot.teleoperators.gamepad.configuration_gamepad import GamepadTeleopConfig

    return GamepadTeleopConfig()
