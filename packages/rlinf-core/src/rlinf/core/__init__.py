"""RLinf core: the channel's Python API, config, logging, metrics and shared RL math.

Modules:
    config: YAML loading with Hydra-style composition, validated into pydantic models.
    logging: loggers with a ``[group rank]`` prefix for workers.
    metrics: ``MetricLogger`` (TensorBoard by default, wandb/swanlab optional).
    progress: progress bars with rate and ETA for long loops.
    cli: the ``rlinf`` command line.
    channel: the shared-memory zero-copy ``Channel`` (also ``rlinf.core.Channel``).
"""

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("rlinf-core")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+unknown"

if TYPE_CHECKING:
    from rlinf.core.channel import Channel

__all__ = ["Channel", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy, so that `import rlinf.core` stays cheap for config-only users.
    if name == "Channel":
        from rlinf.core.channel import Channel

        return Channel
    raise AttributeError(f"module 'rlinf.core' has no attribute {name!r}")
