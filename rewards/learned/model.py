"""A small learned reward model on the policy's own inputs: camera images (+ proprioceptive state) -> ``[0, 1]``.

One network serves both learned rewards of :mod:`rewards.learned`:

- ``kind="classifier"``: ``P(success | observation)``, trained on 0/1 frame labels (the success classifier that
  makes RL possible where no success predicate exists, as LeRobot's human-in-the-loop RL does);
- ``kind="progress"``: task progress in ``[0, 1]`` (the process reward model), trained on milestone fractions.

Architecture: per camera a 3-layer strided CNN (shared across cameras), average-pooled to a 4x4 grid so where
things are in the image survives, flattened, concatenated with a normalized state MLP embedding and, when the
model reads the instruction (:attr:`RewardModelConfig.vocabulary`), the mean embedding of its words, then an MLP
to one logit; ``sigmoid(logit)`` is the output. With :attr:`RewardModelConfig.film` the words' embedding also
scales and shifts every CNN channel before its ReLU (FiLM), so what the CNN looks for depends on the words. Small
on purpose (tens of thousands of parameters): it trains in a few minutes on a CPU from a few hundred episodes.

The instruction matters on multi-task envs: on ``mujoco/pick-any`` a classifier that sees only the cameras and
the arm cannot tell the named cube lifted from another one, and PPO on it learns to lift cubes it was not
asked for. Concatenating the words' embedding after the CNN did not teach this small network to bind the colour
word to the cube in the gripper; FiLM together with instruction-swapped failures
(:attr:`rewards.learned.train.FitConfig.counterfactual`) did (docs/results.md, "Learned rewards"). Words are lower-cased runs of letters and digits; words the training instructions never used are
ignored.

Checkpoints use the policies' folder format (:func:`policies.io.write_checkpoint`: ``config.json`` +
``model.safetensors`` + ``manifest.json``, written to a temporary folder and renamed), with ``"type":
"reward_model"``. ``config.json`` records the observation keys and shapes the model reads
(:attr:`RewardModelConfig.inputs`); :meth:`RewardModel.check_inputs` compares them with an env's observation
spec and :meth:`RewardModel.predict` with each batch, raising :class:`RewardInputError` naming the key and both
shapes.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from policies.io import CheckpointError, ObservationError, read_checkpoint, verify_policy_folder, write_checkpoint
from vla_core.keys import OBS_IMAGE_PREFIX, OBS_STATE, TASK

REWARD_MODEL_TYPE = "reward_model"
"""``config.json["type"]`` of a reward model folder."""
INSTRUCTION_IDS = "instruction_ids"
"""Batch key of pre-computed instruction word ids (:meth:`RewardModel.instruction_ids`), used in training."""
KINDS = ("classifier", "progress")


class RewardInputError(ObservationError):
    """An observation (or env spec) that lacks a key the reward model reads, or has it in another shape."""


@dataclass
class RewardModelConfig:
    """What a reward model reads and how big it is (saved as its ``config.json``)."""

    kind: str = "classifier"
    """``classifier`` (P(success)) or ``progress`` (task progress in [0, 1], the process reward model)."""
    inputs: dict[str, list[int]] = field(default_factory=dict)
    """Observation key -> per-env shape it reads: ``observation.images.<cam>`` ``[H, W, 3]`` (uint8) and
    optionally ``observation.state`` ``[S]``."""
    width: int = 32
    """Channels of the CNN and width of the MLPs."""
    state_mean: list[float] = field(default_factory=list)
    """Per-dimension mean of ``observation.state`` in the training data (inputs are standardized)."""
    state_std: list[float] = field(default_factory=list)
    """Per-dimension std of ``observation.state`` in the training data."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """Held-out metrics written at training time (precision, recall, accuracy, ...), for the record."""
    vocabulary: list[str] = field(default_factory=list)
    """Words of the training instructions; non-empty = the model also reads each observation's instruction
    (``task``) as a bag of these words (module doc). Empty = it does not read the instruction."""
    film: bool = False
    """With a vocabulary: the instruction also scales and shifts every CNN channel (FiLM, Perez et al. 2018), so
    what the cameras are searched for depends on the words (module doc). False: it is only concatenated."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"reward model kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def image_keys(self) -> list[str]:
        return [k for k in self.inputs if k.startswith(OBS_IMAGE_PREFIX)]

    @property
    def state_dim(self) -> int:
        return int(self.inputs[OBS_STATE][0]) if OBS_STATE in self.inputs else 0


class RewardModel(nn.Module):
    """``forward(obs) -> logits [B]``; :meth:`predict` gives ``sigmoid`` in ``[0, 1]`` (see module doc).

    Raises:
        ValueError: for a config that reads no observation key.
    """

    def __init__(self, config: RewardModelConfig) -> None:
        super().__init__()
        if not config.inputs:
            raise ValueError("a reward model must read at least one observation key (config.inputs is empty)")
        self.config = config
        w = config.width
        self.image_keys = config.image_keys
        self.encoder = nn.Sequential(
            nn.Conv2d(3, w, 5, stride=2, padding=2), nn.ReLU(),
            nn.Conv2d(w, w, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(w, w, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(4), nn.Flatten(),
        ) if self.image_keys else None
        s = config.state_dim
        self.state_net = nn.Sequential(nn.Linear(s, w), nn.ReLU()) if s else None
        mean = torch.tensor(config.state_mean or [0.0] * s, dtype=torch.float32)
        std = torch.tensor(config.state_std or [1.0] * s, dtype=torch.float32)
        self.register_buffer("state_mean", mean, persistent=False)
        self.register_buffer("state_std", std.clamp_min(1e-3), persistent=False)
        self.word_index = {word: i + 1 for i, word in enumerate(config.vocabulary)}  # 0: padding / unknown
        self.words = nn.EmbeddingBag(len(config.vocabulary) + 1, w, mode="mean", padding_idx=0) \
            if config.vocabulary else None
        # FiLM: per conv layer a scale and shift of each channel from the instruction; zero-initialized, so an
        # untrained FiLM is the identity
        self.film = nn.Linear(w, 2 * 3 * w) if config.film and config.vocabulary and self.image_keys else None
        if self.film is not None:
            nn.init.zeros_(self.film.weight)
            nn.init.zeros_(self.film.bias)
        features = len(self.image_keys) * w * 16 + (w if s else 0) + (w if config.vocabulary else 0)
        self.head = nn.Sequential(nn.Linear(features, 2 * w), nn.ReLU(), nn.Linear(2 * w, 1))

    @property
    def reads_instruction(self) -> bool:
        return self.words is not None

    def instruction_ids(self, instructions: list[str]) -> Tensor:
        """``int64 [B, L]``: each instruction's known words as vocabulary ids, padded with 0."""
        rows = [[self.word_index.get(w, 0) for w in instruction_words(t)] for t in instructions]
        width = max([len(r) for r in rows] + [1])
        return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long).reshape(len(rows), width)

    def forward(self, obs: dict[str, Any]) -> Tensor:
        """``logits [B]`` of a batch (keys of :attr:`RewardModelConfig.inputs`; images ``uint8 [B, H, W, 3]``;
        with a vocabulary also ``task``, a list of instructions, or :data:`INSTRUCTION_IDS`)."""
        device = self.head[0].weight.device
        words = None
        if self.words is not None:
            ids = obs[INSTRUCTION_IDS] if INSTRUCTION_IDS in obs else self.instruction_ids(list(obs[TASK]))
            words = self.words(ids.to(device))
        parts = [self.encode_image(obs[key].to(device).permute(0, 3, 1, 2).float() / 255.0, words)
                 for key in self.image_keys]
        if self.state_net is not None:
            state = obs[OBS_STATE].to(device).float()
            parts.append(self.state_net((state - self.state_mean) / self.state_std))
        if words is not None:
            parts.append(words)
        return self.head(torch.cat(parts, dim=1)).squeeze(1)

    def encode_image(self, img: Tensor, words: Tensor | None) -> Tensor:
        """``[B, 3, H, W]`` in ``[0, 1]`` -> ``[B, 16 * width]``; with FiLM each conv's channels are scaled by
        ``1 + gamma`` and shifted by ``beta`` (from the instruction) before its ReLU."""
        if self.film is None or words is None:
            return self.encoder(img)  # type: ignore[misc]
        gamma_beta = self.film(words).view(len(img), 3, 2, -1, 1, 1)
        h = img
        for layer, conv in enumerate((0, 2, 4)):
            h = self.encoder[conv](h)  # type: ignore[index]
            h = torch.relu(h * (1 + gamma_beta[:, layer, 0]) + gamma_beta[:, layer, 1])
        return self.encoder[7](self.encoder[6](h))  # type: ignore[index]

    @property
    def read_keys(self) -> list[str]:
        """The observation keys a batch must hold: the inputs, and ``task`` with a vocabulary."""
        return list(self.config.inputs) + ([TASK] if self.reads_instruction else [])

    @torch.no_grad()
    def predict(self, obs: dict[str, Any], where: str = "observation", batch_size: int = 256) -> Tensor:
        """``float32 [B]`` in ``[0, 1]`` (P(success) or progress) on the CPU, in batches of ``batch_size``.

        Raises:
            RewardInputError: naming ``where``, the key and both shapes when the batch does not match.
        """
        self.check_batch(obs, where)
        was = self.training
        self.eval()
        n = next(v.shape[0] for k, v in obs.items() if k in self.config.inputs)
        keys = self.read_keys if INSTRUCTION_IDS not in obs else [*self.config.inputs, INSTRUCTION_IDS]
        out = [torch.sigmoid(self({k: obs[k][i:i + batch_size] for k in keys})).float().cpu()
               for i in range(0, n, batch_size)]
        self.train(was)
        return torch.cat(out) if out else torch.zeros(0)

    def check_batch(self, obs: dict[str, Any], where: str) -> None:
        """Check that ``obs`` holds every input as ``[B, *shape]``.

        Raises:
            RewardInputError: naming ``where``, the key, the model's shape and the batch's.
        """
        for key, shape in self.config.inputs.items():
            if key not in obs:
                raise RewardInputError(f"{where} has no {key!r}, which the reward model reads (model inputs: "
                                       f"{dict(self.config.inputs)}; {where} keys: {sorted(obs)})")
            got = tuple(obs[key].shape[1:])
            if got != tuple(shape):
                raise RewardInputError(f"{where}: {key!r} has shape {list(got)} per env but the reward model was "
                                       f"trained on {list(shape)}")
        if self.reads_instruction and TASK not in obs and INSTRUCTION_IDS not in obs:
            raise RewardInputError(f"{where} has no {TASK!r} (the instruction), which the reward model reads "
                                   f"(trained on instructions with the words {self.config.vocabulary}); "
                                   f"{where} keys: {sorted(obs)}")

    def check_inputs(self, observation_shapes: dict[str, tuple[int, ...]], where: str) -> None:
        """Check an env's observation spec (key -> per-env shape) before any step is taken.

        Raises:
            RewardInputError: naming ``where`` (the env id), the key and both shapes.
        """
        for key, shape in self.config.inputs.items():
            if key not in observation_shapes:
                raise RewardInputError(f"{where} does not emit {key!r}, which the reward model reads "
                                       f"(model inputs: {dict(self.config.inputs)}; the env emits: "
                                       f"{sorted(observation_shapes)})")
            if tuple(observation_shapes[key]) != tuple(shape):
                raise RewardInputError(f"{where}: {key!r} has shape {list(observation_shapes[key])} but the reward "
                                       f"model was trained on {list(shape)}")

    def save(self, directory: str | Path) -> Path:
        """Write the model folder atomically (``config.json``, ``model.safetensors``, ``manifest.json``)."""
        config = {"type": REWARD_MODEL_TYPE, **asdict(self.config)}
        return write_checkpoint(directory, config, self.state_dict())


def instruction_words(instruction: str) -> list[str]:
    """The words of an instruction: lower-cased runs of letters and digits."""
    return re.findall(r"[a-z0-9]+", str(instruction).lower())


def load_reward_model(directory: str | Path) -> RewardModel:
    """Load a reward model folder written by :meth:`RewardModel.save`, verified against its manifest.

    Raises:
        CheckpointError: naming the folder for a missing folder or file, a damaged file, another type of
            checkpoint (e.g. a policy folder) or weights that do not fit the config.
    """
    folder = Path(directory)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such reward model folder (train one with `vla-rl reward train`)")
    verify_policy_folder(folder)
    data, tensors = read_checkpoint(folder)
    kind = data.pop("type", None)
    if kind != REWARD_MODEL_TYPE:
        raise CheckpointError(f"{folder}: config.json has type {kind!r}, not a reward model ({REWARD_MODEL_TYPE!r}); "
                              "pass a folder written by `vla-rl reward train`")
    try:
        config = RewardModelConfig(**data)
        model = RewardModel(config)
        model.load_state_dict(tensors)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{folder}: not a loadable reward model ({' '.join(str(exc).split())[:300]})") from None
    return model.eval()
