from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pytest

from rlinf.core.logging import _StderrHandler, get_logger, get_worker_logger, setup_logging


@pytest.fixture(autouse=True)
def _restore_level(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("RLINF_LOG_LEVEL", raising=False)
    yield
    setup_logging("INFO")


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    """Records reaching the ``rlinf`` logger, which does not propagate to the root logger."""

    class ListHandler(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    handler = ListHandler()
    root = logging.getLogger("rlinf")
    root.addHandler(handler)
    yield handler.records
    root.removeHandler(handler)


def test_import_resolves_stdlib_logging() -> None:
    import rlinf.core.logging as rlinf_logging

    # ``import logging`` inside rlinf/core/logging.py must be the standard library.
    assert vars(rlinf_logging)["logging"] is logging
    assert logging.__file__ != rlinf_logging.__file__
    assert issubclass(rlinf_logging.WorkerLoggerAdapter, logging.LoggerAdapter)


def test_worker_prefix_and_format_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    get_worker_logger("actor", 3).info("loss=%s", 0.1)
    err = capsys.readouterr().err
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d INFO \[actor 3\] loss=0\.1\n", err), err


def test_worker_fields_on_record(records: list[logging.LogRecord]) -> None:
    get_worker_logger("rollout", 0).warning("slow step", extra={"step": 7})
    (record,) = records
    assert record.getMessage() == "[rollout 0] slow step"
    assert record.levelno == logging.WARNING
    assert (record.group, record.rank, record.step) == ("rollout", 0, 7)  # type: ignore[attr-defined]
    assert record.name == "rlinf.worker"


def test_get_logger_names_are_in_rlinf_tree() -> None:
    assert get_logger().name == "rlinf"
    assert get_logger("metrics").name == "rlinf.metrics"
    assert get_logger("rlinf.sched").name == "rlinf.sched"


def test_setup_is_idempotent() -> None:
    setup_logging()
    setup_logging("debug")
    root = logging.getLogger("rlinf")
    # pytest may attach its own capture handlers too; count ours.
    assert sum(isinstance(h, _StderrHandler) for h in root.handlers) == 1
    assert root.level == logging.DEBUG
    assert root.propagate is False


def test_level_from_env(monkeypatch: pytest.MonkeyPatch, records: list[logging.LogRecord]) -> None:
    monkeypatch.setenv("RLINF_LOG_LEVEL", "warning")
    setup_logging()
    log = get_logger("test")
    log.info("hidden")
    log.warning("shown")
    assert [r.getMessage() for r in records] == ["shown"]


def test_invalid_env_level_names_variable_value_and_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RLINF_LOG_LEVEL", "verbose")
    with pytest.raises(ValueError, match="RLINF_LOG_LEVEL='verbose'") as info:
        setup_logging()
    assert "DEBUG, INFO, WARNING, ERROR, CRITICAL" in str(info.value)


def test_invalid_level_argument() -> None:
    with pytest.raises(ValueError, match="level='loud'"):
        setup_logging("loud")
