from __future__ import annotations

import importlib.machinery
import logging
import math
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlinf.core.config.schema import LoggerConfig
from rlinf.core.metrics import MetricLogger, MissingBackendError, format_number


def read_scalars(tb_dir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture
def rlinf_caplog(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """caplog for the ``rlinf`` logger, which does not propagate to the root logger.

    pytest attaches caplog to non-propagating loggers only if they already existed
    when the test started, so attach it explicitly.
    """
    root = logging.getLogger("rlinf")
    root.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="rlinf")
    yield caplog
    root.removeHandler(caplog.handler)


def test_tensorboard_values_read_back(tmp_path: Path) -> None:
    logged: dict[int, dict[str, Any]] = {
        0: {"train/loss": 1.5, "train/lr": 3e-4, "env/episodes": 4},
        1: {"train/loss": np.float32(0.7312), "train/lr": np.float64(2.5e-4)},
        5: {"train/loss": np.array(0.25), "eval/return": np.int64(-12), "time/step": 1.21},
    }
    with MetricLogger(tmp_path, "run1", run_config={"lr": 3e-4, "path": Path("/data")}) as m:
        for step, metrics in logged.items():
            m.log(metrics, step=step)
        assert m.tensorboard_dir == tmp_path / "run1" / "tensorboard"

    tb_dir = tmp_path / "run1" / "tensorboard"
    assert list(tb_dir.glob("events.out.tfevents.*"))
    expected: dict[str, list[tuple[int, float]]] = {}
    for step, metrics in logged.items():
        for key, value in metrics.items():
            expected.setdefault(key, []).append((step, float(value)))
    scalars = read_scalars(tb_dir)
    assert scalars.keys() == expected.keys()
    for key, points in expected.items():
        assert [s for s, _ in scalars[key]] == [s for s, _ in points], key
        assert [v for _, v in scalars[key]] == pytest.approx([v for _, v in points], rel=1e-6)

    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    text = acc.Tensors("run_config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"lr": 0.0003' in text and '"path": "/data"' in text


def test_console_summary_line(tmp_path: Path, rlinf_caplog: pytest.LogCaptureFixture) -> None:
    with MetricLogger(tmp_path, "run", backends=()) as m:
        m.log(
            {"time/step": 1.2104, "train/loss": 0.123449, "train/lr": 3e-4, "eval/ret": 250.0},
            step=12,
        )
    lines = [r.getMessage() for r in rlinf_caplog.records if r.name == "rlinf.metrics"]
    assert lines == ["step 12 | train: loss=0.1234 lr=3e-4 | eval: ret=250 | time: step=1.21s"]
    assert not (tmp_path / "run").exists()  # no backends, no files


def test_console_every(tmp_path: Path, rlinf_caplog: pytest.LogCaptureFixture) -> None:
    with MetricLogger(tmp_path, "run", backends=(), console_every=2) as m:
        for step in range(1, 6):
            m.log({"train/loss": step}, step=step)
    lines = [r.getMessage() for r in rlinf_caplog.records if r.name == "rlinf.metrics"]
    assert lines == ["step 2 | train: loss=2", "step 4 | train: loss=4"]


def test_console_off(tmp_path: Path, rlinf_caplog: pytest.LogCaptureFixture) -> None:
    with MetricLogger(tmp_path, "run", backends=(), console=False) as m:
        m.log({"train/loss": 1.0}, step=1)
    assert not rlinf_caplog.records


def test_non_finite_written_and_warned_once_per_key(
    tmp_path: Path, rlinf_caplog: pytest.LogCaptureFixture
) -> None:
    with MetricLogger(tmp_path, "run", console=False) as m:
        m.log({"train/loss": float("nan"), "train/kl": float("inf")}, step=1)
        m.log({"train/loss": float("nan"), "train/kl": 0.5}, step=2)
    warnings = [r.getMessage() for r in rlinf_caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "'train/loss' is nan at step 1" in warnings[0]
    assert "'train/kl' is inf at step 1" in warnings[1]
    scalars = read_scalars(tmp_path / "run" / "tensorboard")
    assert [s for s, _ in scalars["train/loss"]] == [1, 2]
    assert all(math.isnan(v) for _, v in scalars["train/loss"])
    assert scalars["train/kl"] == [(1, math.inf), (2, 0.5)]


@pytest.mark.parametrize(
    ("value", "type_name"), [("high", "str"), (None, "NoneType"), (np.zeros(3), "ndarray")]
)
def test_non_numeric_value_names_key_and_writes_nothing(
    tmp_path: Path, value: object, type_name: str
) -> None:
    with (
        MetricLogger(tmp_path, "run", console=False) as m,
        pytest.raises(TypeError, match=f"'train/bad'.*{type_name}"),
    ):
        m.log({"train/ok": 1.0, "train/bad": value}, step=3)
    assert read_scalars(tmp_path / "run" / "tensorboard") == {}


def test_unknown_backend(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\['mlflow'\].*'tensorboard', 'wandb', 'swanlab'"):
        MetricLogger(tmp_path, "run", backends=("tensorboard", "mlflow"))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("backend", ["wandb", "swanlab"])
def test_missing_optional_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    # A None entry in sys.modules makes the package unimportable whether or not it is installed.
    monkeypatch.setitem(sys.modules, backend, None)
    with pytest.raises(MissingBackendError) as info:
        MetricLogger(tmp_path, "run", backends=("tensorboard", backend))
    assert isinstance(info.value, ImportError)
    assert str(info.value) == (
        f"logger_backends includes '{backend}' but the '{backend}' package is not installed; "
        f"install it with `uv pip install {backend}` or `pip install 'rlinf-core[{backend}]'`, "
        f"or remove '{backend}' from runner.logger.logger_backends"
    )
    assert not (tmp_path / "run").exists()  # checked before any backend creates files


def _fake_module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


def test_wandb_backend_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checks the calls against a stand-in module; the real wandb is not installed here."""
    calls: list[tuple[str, Any]] = []

    class Run:
        def log(self, data: dict[str, float], step: int) -> None:
            calls.append(("log", (data, step)))

        def finish(self) -> None:
            calls.append(("finish", None))

    def init(**kwargs: Any) -> Run:
        calls.append(("init", kwargs))
        return Run()

    monkeypatch.setitem(sys.modules, "wandb", _fake_module("wandb", init=init))
    m = MetricLogger(
        tmp_path, "exp", "proj", backends=("wandb",), run_config={"a": 1}, console=False
    )
    m.log({"train/loss": np.float32(0.5)}, step=4)
    m.close()
    assert calls == [
        (
            "init",
            {"project": "proj", "name": "exp", "dir": str(tmp_path / "exp"), "config": {"a": 1}},
        ),
        ("log", ({"train/loss": 0.5}, 4)),
        ("finish", None),
    ]


def test_swanlab_backend_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checks the calls against a stand-in module; the real swanlab is not installed here."""
    calls: list[tuple[str, Any]] = []
    fake = _fake_module(
        "swanlab",
        init=lambda **kw: calls.append(("init", kw)),
        log=lambda data, step: calls.append(("log", (data, step))),
        finish=lambda: calls.append(("finish", None)),
    )
    monkeypatch.setitem(sys.modules, "swanlab", fake)
    with MetricLogger(tmp_path, "exp", "proj", backends=("swanlab",), console=False) as m:
        m.log({"eval/acc": 1}, step=2)
    logdir = tmp_path / "exp" / "swanlab"
    assert logdir.is_dir()
    assert calls == [
        (
            "init",
            {"project": "proj", "experiment_name": "exp", "logdir": str(logdir), "config": None},
        ),
        ("log", ({"eval/acc": 1.0}, 2)),
        ("finish", None),
    ]


def test_flush_puts_everything_on_disk_and_logging_continues(tmp_path: Path) -> None:
    """flush() returns only when every logged value is readable (a runner's end of run)."""
    tb_dir = tmp_path / "run" / "tensorboard"
    m = MetricLogger(tmp_path, "run", console=False)
    for step in range(50):  # more than tensorboardX's 10-event queue
        m.log({"train/loss": float(step), "eval/acc": step / 100}, step=step)
    m.flush()
    scalars = read_scalars(tb_dir)
    assert [s for s, _ in scalars["train/loss"]] == list(range(50))
    assert scalars["eval/acc"][-1] == (49, pytest.approx(0.49))
    m.log({"train/loss": 50.0}, step=50)  # the run goes on after a flush
    m.flush()
    assert read_scalars(tb_dir)["train/loss"][-1] == (50, 50.0)
    m.close()
    assert len(read_scalars(tb_dir)["train/loss"]) == 51


def test_close_is_idempotent_and_log_after_close_fails(tmp_path: Path) -> None:
    m = MetricLogger(tmp_path, "run", console=False)
    m.log({"train/loss": 1.0}, step=0)
    m.close()
    m.close()
    with pytest.raises(RuntimeError, match="after close"):
        m.log({"train/loss": 2.0}, step=1)
    assert read_scalars(tmp_path / "run" / "tensorboard") == {"train/loss": [(0, 1.0)]}


def test_from_config(tmp_path: Path) -> None:
    cfg = LoggerConfig(
        log_path=tmp_path,
        project_name="p",
        experiment_name="cfg-run",
        logger_backends=["tensorboard"],
    )
    with MetricLogger.from_config(cfg, run_config={"seed": 1}, console=False) as m:
        assert m.experiment_dir == cfg.experiment_dir
        assert m.backend_names == ("tensorboard",)
        m.log({"rollout/reward": 0.75}, step=9)
    assert read_scalars(cfg.experiment_dir / "tensorboard") == {"rollout/reward": [(9, 0.75)]}


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.123449, "0.1234"),
        (3e-4, "3e-4"),
        (1.2104, "1.21"),
        (250.0, "250"),
        (-7, "-7"),
        (2_500_000, "2.5e6"),
        (12345.6, "1.235e4"),
        (0.05, "0.05"),
        (float("nan"), "nan"),
        (float("-inf"), "-inf"),
    ],
)
def test_format_number(value: float, text: str) -> None:
    assert format_number(value) == text
