from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlinf.core.config.schema import LoggerConfig
from rlinf.core.metrics import MetricLogger, MissingBackendError, format_number


def read_scalars(tb_dir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


LOGGED: dict[int, dict[str, Any]] = {
    0: {"train/loss": 1.5, "train/lr": 3e-4, "env/episodes": 4},
    1: {"train/loss": np.float32(0.7312), "train/lr": np.float64(2.5e-4)},
    5: {"train/loss": np.array(0.25), "eval/return": np.int64(-12), "time/step": 1.21},
}
"""Steps and metrics the backend tests log (numpy scalars and 0-d arrays included)."""


def expected_points() -> dict[str, list[tuple[int, float]]]:
    expected: dict[str, list[tuple[int, float]]] = {}
    for step, metrics in LOGGED.items():
        for key, value in metrics.items():
            expected.setdefault(key, []).append((step, float(value)))
    return expected


def assert_same_points(
    actual: dict[str, list[tuple[int, float]]],
    expected: dict[str, list[tuple[int, float]]],
    rel: float = 1e-6,  # TensorBoard stores float32
) -> None:
    assert actual.keys() == expected.keys()
    for key, points in expected.items():
        assert [s for s, _ in actual[key]] == [s for s, _ in points], key
        assert [v for _, v in actual[key]] == pytest.approx([v for _, v in points], rel=rel), key


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
    with MetricLogger(tmp_path, "run1", run_config={"lr": 3e-4, "path": Path("/data")}) as m:
        for step, metrics in LOGGED.items():
            m.log(metrics, step=step)
        assert m.tensorboard_dir == tmp_path / "run1" / "tensorboard"

    tb_dir = tmp_path / "run1" / "tensorboard"
    assert list(tb_dir.glob("events.out.tfevents.*"))
    assert_same_points(read_scalars(tb_dir), expected_points())

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


def test_summarize_overrides_console_every(
    tmp_path: Path, rlinf_caplog: pytest.LogCaptureFixture
) -> None:
    with MetricLogger(tmp_path, "run", backends=(), console_every=2) as m:
        m.log({"train/loss": 1}, step=1, summarize=True)
        m.log({"train/loss": 2}, step=2, summarize=False)
        m.log({"train/loss": 3}, step=3)
        m.log({"train/loss": 4}, step=4)
    lines = [r.getMessage() for r in rlinf_caplog.records if r.name == "rlinf.metrics"]
    assert lines == ["step 1 | train: loss=1", "step 4 | train: loss=4"]


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


@pytest.fixture
def offline_services(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """wandb and swanlab in their offline modes: no account, no network, files in tmp_path.

    On teardown, stops wandb's service process (wandb-core, started by ``wandb.init``
    and otherwise left running until the interpreter exits) and checks that no process
    started during the test is left behind.
    """
    for var in ("WANDB_API_KEY", "WANDB_BASE_URL", "SWANLAB_API_KEY", "SWANLAB_API_HOST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("SWANLAB_MODE", "offline")
    for name in ("CONFIG", "CACHE", "DATA"):  # wandb's files outside the run folder
        monkeypatch.setenv(f"WANDB_{name}_DIR", str(tmp_path / f"wandb-{name.lower()}"))
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()
    new = [p for p in me.children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(new, timeout=10)
    assert not alive, f"processes left running: {[p.name() for p in alive]}"


def read_wandb_run(run_file: Path) -> tuple[dict[str, Any], dict[str, list[tuple[int, float]]]]:
    """A .wandb transaction log's run record and history, read with wandb's own reader.

    ``wandb leet inspect --json`` prints the log's records, one JSON object a line.
    """
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_file)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        # The CLI's own log goes to WANDB_DIR/wandb (the run's folder), not the temp dir.
        env={**os.environ, "WANDB_DIR": str(run_file.parents[2])},
    ).stdout
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    (run,) = [r["run"] for r in records if r["type"] == "run"]
    history: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        if record["type"] == "history":
            step = int(record["history"]["step"].get("num", 0))
            for key, value in record["history"]["item"].items():
                if not key.startswith("_"):  # wandb's own _step, _runtime, _timestamp
                    history.setdefault(key, []).append((step, float(value)))
    return run, history


def read_swanlab_run(run_file: Path) -> tuple[list[str], dict[str, list[tuple[int, float]]]]:
    """A .swanlab run file's record kinds and scalars, read with swanlab's own store reader."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    reader = DataStoreReader()
    reader.open(run_file)
    kinds: list[str] = []
    scalars: dict[str, list[tuple[int, float]]] = {}
    try:
        for data in reader:
            record = Record()
            record.ParseFromString(data)
            kinds.append(record.WhichOneof("record_type") or "")
            if kinds[-1] == "scalar":
                scalar = record.scalar
                scalars.setdefault(scalar.key, []).append((scalar.step, scalar.value.number))
            if kinds[-1] == "start":
                kinds.append(f"{record.start.project}/{record.start.name}")
    finally:
        reader.close()
    return kinds, scalars


def test_wandb_offline_run_reads_back(tmp_path: Path, offline_services: None) -> None:
    """A real wandb run in offline mode: the .wandb file holds every logged step and value."""
    config = {"lr": 3e-4, "path": Path("/data")}
    with MetricLogger(
        tmp_path, "exp", "proj", backends=("tensorboard", "wandb"), run_config=config, console=False
    ) as m:
        for step, metrics in LOGGED.items():
            m.log(metrics, step=step)

    (run_file,) = (tmp_path / "exp" / "wandb").glob("offline-run-*/run-*.wandb")
    run, history = read_wandb_run(run_file)
    assert history == expected_points()
    assert (run["project"], run["display_name"]) == ("proj", "exp")
    assert {k: v for k, v in run["config"]["update"].items() if k != "_wandb"} == {
        "lr": 3e-4,
        "path": "/data",
    }
    assert_same_points(read_scalars(tmp_path / "exp" / "tensorboard"), history)


def test_swanlab_offline_run_reads_back(tmp_path: Path, offline_services: None) -> None:
    """A real swanlab run in offline mode: the .swanlab file holds every logged step and value."""
    config = {"lr": 3e-4, "path": Path("/data")}
    with MetricLogger(
        tmp_path,
        "exp",
        "proj",
        backends=("tensorboard", "swanlab"),
        run_config=config,
        console=False,
    ) as m:
        for step, metrics in LOGGED.items():
            m.log(metrics, step=step)

    (run_file,) = (tmp_path / "exp" / "swanlab").glob("run-*/run-*.swanlab")
    kinds, scalars = read_swanlab_run(run_file)
    assert scalars == expected_points()
    assert kinds[:2] == ["start", "proj/exp"]
    assert kinds[-1] == "finish"
    saved = yaml.safe_load((run_file.parent / "files" / "config.yaml").read_text())
    assert {k: v["value"] for k, v in saved.items()} == {"lr": 3e-4, "path": "/data"}
    assert_same_points(read_scalars(tmp_path / "exp" / "tensorboard"), scalars)


def test_all_backends_offline_in_one_run(tmp_path: Path, offline_services: None) -> None:
    """TensorBoard, wandb and swanlab side by side record the same steps and values."""
    with MetricLogger(tmp_path, "exp", backends=("tensorboard", "wandb", "swanlab")) as m:
        for step, metrics in LOGGED.items():
            m.log(metrics, step=step)
    expected = expected_points()
    (wandb_file,) = (tmp_path / "exp" / "wandb").glob("offline-run-*/run-*.wandb")
    assert read_wandb_run(wandb_file)[1] == expected
    (swanlab_file,) = (tmp_path / "exp" / "swanlab").glob("run-*/run-*.swanlab")
    assert read_swanlab_run(swanlab_file)[1] == expected
    assert_same_points(read_scalars(tmp_path / "exp" / "tensorboard"), expected)


def test_tensorboard_values_readable_when_log_returns(tmp_path: Path) -> None:
    """Each log() is on disk when it returns; flush() and close() keep one event file."""
    tb_dir = tmp_path / "run" / "tensorboard"
    m = MetricLogger(tmp_path, "run", console=False)
    for step in range(50):
        m.log({"train/loss": float(step), "eval/acc": step / 100}, step=step)
    scalars = read_scalars(tb_dir)  # no flush()
    assert [s for s, _ in scalars["train/loss"]] == list(range(50))
    assert scalars["eval/acc"][-1] == (49, pytest.approx(0.49))
    m.flush()
    m.log({"train/loss": 50.0}, step=50)  # the run goes on after a flush
    assert read_scalars(tb_dir)["train/loss"][-1] == (50, 50.0)
    m.close()
    assert len(read_scalars(tb_dir)["train/loss"]) == 51
    assert len(list(tb_dir.iterdir())) == 1


def test_tensorboard_loggers_in_one_second_keep_separate_files(tmp_path: Path) -> None:
    """Event files are named by second; two writers in the same second must not collide."""
    for step in range(3):
        with MetricLogger(tmp_path, "run", console=False) as m:
            m.log({"train/loss": float(step)}, step=step)
    tb_dir = tmp_path / "run" / "tensorboard"
    assert len(list(tb_dir.iterdir())) == 3
    assert read_scalars(tb_dir) == {"train/loss": [(0, 0.0), (1, 1.0), (2, 2.0)]}


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
