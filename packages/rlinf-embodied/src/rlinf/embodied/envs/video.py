"""Episode videos: collect RGB frames of one env and write them with imageio.

MP4 (H.264 through ``imageio-ffmpeg``) is preferred; without ffmpeg the video
is written as a GIF instead. Frames with odd sides are padded by one pixel
(H.264 needs even sides).
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["VideoRecorder"]

log = logging.getLogger(__name__)


def _has_ffmpeg() -> bool:
    return importlib.util.find_spec("imageio_ffmpeg") is not None


class VideoRecorder:
    """Buffers frames and writes them as one file per :meth:`flush`.

    Files are ``<directory>/<counter:05d>.mp4`` (or ``.gif``), numbered from 0.

    Args:
        directory: Folder to write into (created on the first write).
        fps: Frames per second of the written videos.
    """

    def __init__(self, directory: Path, fps: float) -> None:
        self.directory = Path(directory)
        self.fps = float(fps)
        self.counter = 0
        self.written: list[Path] = []
        self._frames: list[NDArray[Any]] = []

    @property
    def num_frames(self) -> int:
        """Frames buffered since the last flush."""
        return len(self._frames)

    def add_frame(self, frame: NDArray[Any]) -> None:
        """Appends one ``[H, W, 3]`` uint8 frame (copied)."""
        array = np.asarray(frame)
        if array.ndim != 3 or array.shape[-1] != 3:
            raise ValueError(f"a video frame must be [H, W, 3], got shape {array.shape}")
        if self._frames and array.shape != self._frames[0].shape:
            raise ValueError(
                f"video frame shape {array.shape} differs from the first frame's "
                f"{self._frames[0].shape}"
            )
        self._frames.append(np.array(array, dtype=np.uint8, copy=True))

    def clear(self) -> None:
        """Drops the buffered frames without writing them."""
        self._frames = []

    def flush(self) -> Path | None:
        """Writes the buffered frames as one video and clears the buffer.

        Returns:
            The written file, or None if there were no frames.

        Raises:
            ImportError: If imageio is not installed (names the ``video`` extra).
        """
        if not self._frames:
            return None
        try:
            import imageio.v2 as imageio
        except ImportError as exc:
            raise ImportError(
                "video saving needs imageio; install it with: "
                "uv pip install 'rlinf-embodied[video]'"
            ) from exc
        frames = [_pad_even(f) for f in self._frames]
        self._frames = []
        self.directory.mkdir(parents=True, exist_ok=True)
        if _has_ffmpeg():
            path = self.directory / f"{self.counter:05d}.mp4"
            imageio.mimwrite(path, frames, fps=self.fps, macro_block_size=2)  # type: ignore[arg-type]
        else:
            path = self.directory / f"{self.counter:05d}.gif"
            log.warning("imageio-ffmpeg is not installed; writing %s as a GIF", path)
            imageio.mimwrite(path, frames, duration=1000.0 / self.fps, loop=0)  # type: ignore[arg-type]
        self.counter += 1
        self.written.append(path)
        return path


def _pad_even(frame: NDArray[Any]) -> NDArray[Any]:
    h, w = frame.shape[:2]
    if h % 2 == 0 and w % 2 == 0:
        return frame
    return np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
