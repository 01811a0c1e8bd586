"""Run logging: every scalar to a JSONL file, TensorBoard and wandb (offline unless a key is configured).

``RunLogger.log(step, {"train/loss": 0.3, ...})`` writes each scalar to all
three sinks; ``log_video`` stores an MP4 in the run folder and hands it to
wandb. The JSONL (``metrics.jsonl``) is the source for the run report's plots.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class LoggingConfig:
    """Where metrics go."""

    wandb: bool = True
    """Log to wandb; offline (a local run folder) unless WANDB_API_KEY is set or WANDB_MODE says otherwise."""
    wandb_project: str = "vla-rl"
    """wandb project name."""
    tensorboard: bool = True
    """Write TensorBoard event files to ``<run>/tb``."""


def drop_torn_line(path: Path) -> None:
    """Cut a last line that a kill left half-written (no final newline) from the append-only log ``path``, so
    the rows a resumed run appends are not glued to it. The torn row belongs to the iteration in flight at the
    kill, which the resumed run redoes."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, "r+b") as f:
        data = f.read()
        if data.endswith(b"\n"):
            return
        f.truncate(data.rfind(b"\n") + 1)
        f.flush()
        os.fsync(f.fileno())


class RunLogger:
    """Fan scalars out to ``metrics.jsonl``, TensorBoard and wandb.

    Args:
        run_dir: the run folder; created if missing.
        cfg: which sinks are on.
        config: the run's config, stored with the wandb run.
        resume: append to an existing ``metrics.jsonl`` (a resumed run).
    """

    def __init__(self, run_dir: str | Path, cfg: LoggingConfig, config: Mapping[str, Any] | None = None, resume: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.run_dir / "metrics.jsonl"
        if resume:
            drop_torn_line(self.jsonl_path)
        self._jsonl = open(self.jsonl_path, "a" if resume else "w", buffering=1)
        self._tb = None
        self._wandb = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tb"))
        if cfg.wandb:
            import wandb

            if not os.environ.get("WANDB_API_KEY") and "WANDB_MODE" not in os.environ:
                os.environ["WANDB_MODE"] = "offline"
            os.environ.setdefault("WANDB_SILENT", "true")
            self._wandb = wandb.init(
                project=cfg.wandb_project,
                dir=str(self.run_dir),
                name=self.run_dir.name,
                config=dict(config or {}),
                resume="allow" if resume else None,
                id=_wandb_id(self.run_dir),
                reinit="finish_previous",
            )

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        """Record ``scalars`` at env-step ``step`` (non-finite values are kept as null in the JSONL)."""
        clean = {k: float(v) for k, v in scalars.items()}
        self._jsonl.write(json.dumps({"step": int(step), **{k: (v if math.isfinite(v) else None) for k, v in clean.items()}}) + "\n")
        if self._tb is not None:
            for k, v in clean.items():
                self._tb.add_scalar(k, v, global_step=step)
        if self._wandb is not None:
            self._wandb.log(clean, step=int(step))

    def log_video(self, step: int, key: str, path: str | Path, fps: float) -> None:
        """Attach an MP4 already written to the run folder to wandb."""
        if self._wandb is not None:
            import wandb

            self._wandb.log({key: wandb.Video(str(path), format="mp4")}, step=int(step))

    def close(self) -> None:
        """Flush and close every sink. Idempotent."""
        if self._jsonl and not self._jsonl.closed:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _wandb_id(run_dir: Path) -> str:
    """A stable wandb run id per run folder, so a resumed run continues the same wandb run."""
    id_file = run_dir / ".wandb_id"
    if id_file.exists():
        return id_file.read_text().strip()
    import secrets

    run_id = secrets.token_hex(4)
    id_file.write_text(run_id)
    return run_id


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``metrics.jsonl`` file (a truncated last line from a crash is skipped)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
