"""Record camera streams to MP4 (H.264 through imageio-ffmpeg's bundled ffmpeg)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from sim.core import EnvError, tile_images


class VideoWriter:
    """Collect RGB frames and write them to ``path`` atomically on :meth:`close`.

    Frames are ``uint8 [H, W, 3]``; sizes are padded to even numbers (H.264 needs them).
    """

    def __init__(self, path: str | Path, fps: float) -> None:
        self.path = Path(path)
        self.fps = float(fps)
        self.frames: list[np.ndarray] = []

    def add(self, frame: np.ndarray) -> None:
        """Append one ``uint8 [H, W, 3]`` frame."""
        frame = np.asarray(frame)
        if frame.ndim != 3 or frame.shape[-1] != 3 or frame.dtype != np.uint8:
            raise ValueError(f"video frame must be uint8 [H, W, 3], got {frame.dtype} {list(frame.shape)}")
        self.frames.append(frame)

    def add_obs(self, obs: dict[str, Any], image_keys: list[str], max_envs: int = 4) -> None:
        """Append a frame tiling the first ``max_envs`` envs, cameras side by side."""
        if not image_keys:
            raise EnvError("no camera observations to record; use obs_mode=rgb")
        views = [np.asarray(obs[k][:max_envs]) for k in image_keys]
        h = max(v.shape[1] for v in views)
        views = [np.pad(v, ((0, 0), (0, h - v.shape[1]), (0, 0), (0, 0))) for v in views]
        self.add(tile_images(np.concatenate(views, axis=2)))

    def close(self) -> Path | None:
        """Encode and move the MP4 into place; returns its path (None if no frames)."""
        if not self.frames:
            return None
        import imageio.v2 as imageio

        h = max(f.shape[0] for f in self.frames)
        w = max(f.shape[1] for f in self.frames)
        h2, w2 = h + h % 2, w + w % 2
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.stem}.tmp{os.getpid()}.mp4")
        writer = imageio.get_writer(tmp, fps=self.fps, codec="libx264", macro_block_size=1, quality=7)
        try:
            for f in self.frames:
                writer.append_data(np.pad(f, ((0, h2 - f.shape[0]), (0, w2 - f.shape[1]), (0, 0))))
        finally:
            writer.close()
        os.replace(tmp, self.path)
        self.frames = []
        return self.path
