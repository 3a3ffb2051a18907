"""RLinf core: the channel's Python API, config, logging, metrics and shared RL math.

Modules:
    config: YAML loading with Hydra-style composition, validated into pydantic models.
    logging: loggers with a ``[group rank]`` prefix for workers.
    metrics: ``MetricLogger`` (TensorBoard by default, wandb/swanlab optional).
    progress: progress bars with rate and ETA for long loops.
    cli: the ``rlinf`` command line.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rlinf-core")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
