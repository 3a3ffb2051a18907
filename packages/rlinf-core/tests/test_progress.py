from __future__ import annotations

import io
import logging
import re
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from rlinf.core.logging import get_logger
from rlinf.core.metrics import MetricLogger
from rlinf.core.progress import (
    progress_bar,
    progress_enabled,
    rate_postfix,
    track,
    training_console,
)


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _no_progress_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLINF_PROGRESS", raising=False)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)


def test_enabled_bar_shows_desc_count_rate_and_postfix() -> None:
    buf = io.StringIO()
    with progress_bar(total=3, desc="rollout", file=buf, disable=False) as bar:
        for _ in range(3):
            time.sleep(0.01)
            bar.update(loss=0.123449, env=rate_postfix(4096, 0.5, "steps"))
    final = buf.getvalue().split("\r")[-1]
    assert final.startswith("rollout: 100%")
    assert "3/3" in final
    # a rate is shown; tqdm writes "s/step" instead of "step/s" below 1 step/s
    assert re.search(r"\d+(\.\d+)?(step/s|s/step)", final), final
    assert "loss=0.1234, env=8192 steps/s" in final


def test_initial_and_unknown_total() -> None:
    buf = io.StringIO()
    with progress_bar(total=10, desc="train", initial=5, file=buf, disable=False) as bar:
        bar.update(2)
        assert bar.n == 7
    assert "7/10" in buf.getvalue().split("\r")[-1]

    buf = io.StringIO()
    with progress_bar(total=None, desc="stream", unit="ep", file=buf, disable=False) as bar:
        bar.update(4)
    final = buf.getvalue().split("\r")[-1]
    assert final.startswith("stream: 4ep ")


def test_track_forced_on_by_env(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RLINF_PROGRESS", "1")
    items = []
    for item in track(range(4), desc="envs", unit="ep"):
        time.sleep(0.01)
        items.append(item)
    assert items == [0, 1, 2, 3]
    final = capsys.readouterr().err.split("\r")[-1]
    assert "envs" in final and "4/4" in final
    assert re.search(r"\d+(\.\d+)?(ep/s|s/ep)", final), final


def test_disabled_when_not_a_tty(capsys: pytest.CaptureFixture[str]) -> None:
    # Under capsys stderr is not a terminal and RLINF_PROGRESS is unset: no output.
    gen = (i * i for i in range(5))  # no len(): total stays unknown
    assert list(track(gen, desc="quiet")) == [0, 1, 4, 9, 16]
    with progress_bar(total=3, desc="quiet") as bar:
        assert bar.disabled
        bar.update(2, loss=1.0)
        assert bar.n == 2
    assert capsys.readouterr().err == ""


def test_enabled_decision() -> None:
    assert progress_enabled(FakeTTY()) is True
    assert progress_enabled(io.StringIO()) is False


def test_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLINF_PROGRESS", "0")
    tty = FakeTTY()
    assert progress_enabled(tty) is False
    with progress_bar(total=2, desc="off", file=tty) as bar:
        bar.update(2)
    assert tty.getvalue() == ""

    monkeypatch.setenv("RLINF_PROGRESS", "1")
    assert progress_enabled(io.StringIO()) is True

    monkeypatch.setenv("RLINF_PROGRESS", "yes")
    with pytest.raises(ValueError, match="RLINF_PROGRESS='yes'"):
        progress_enabled()


def test_tqdm_disable_turns_bars_off_unless_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert progress_enabled(FakeTTY()) is False
    monkeypatch.setenv("RLINF_PROGRESS", "1")
    assert progress_enabled(io.StringIO()) is True


def test_rate_postfix() -> None:
    assert rate_postfix(4096, 0.5, "steps") == "8192 steps/s"
    assert rate_postfix(1, 3) == "0.3333 it/s"
    assert rate_postfix(10, 0.0, "steps") == "? steps/s"


# ---------------------------------------------------------------- the training console


def screen(text: str) -> list[str]:
    """The lines a terminal shows for ``text``: ``\\r`` returns to column 0 and overwrites."""
    lines: list[list[str]] = [[]]
    col = 0
    for char in text:
        if char == "\n":
            lines.append([])
            col = 0
        elif char == "\r":
            col = 0
        else:
            line = lines[-1]
            line.extend(" " * (col + 1 - len(line)))
            line[col] = char
            col += 1
    return ["".join(line).rstrip() for line in lines if "".join(line).strip()]


def summary_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rlinf.metrics"]


@pytest.fixture
def rlinf_caplog(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """caplog for the ``rlinf`` logger, which does not propagate to the root logger."""
    root = logging.getLogger("rlinf")
    root.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="rlinf")
    yield caplog
    root.removeHandler(caplog.handler)


WATCH = {"return": "env/return", "eval_return": "eval/return", "loss": "train/loss"}


def step_metrics(step: int) -> dict[str, float]:
    metrics = {"env/return": 10.0 * step, "train/loss": 0.5 / step, "time/step": 0.25}
    if step % 2 == 0:
        metrics["eval/return"] = 100.0 * step
    return metrics


def test_bar_postfix_holds_only_the_watched_metrics(tmp_path: Path) -> None:
    tty = FakeTTY()
    with (
        MetricLogger(tmp_path, "run", backends=()) as metrics,
        training_console(
            metrics, total=3, desc="train", watch=WATCH, summary_interval=1, file=tty
        ) as console,
    ):
        for step in (1, 2, 3):
            console.step(step_metrics(step), step)
    bar = screen(tty.getvalue())[-1]
    # step 3 reports no eval: the bar keeps step 2's eval value, in the watch order
    assert bar.startswith("train: 100%") and "3/3" in bar
    assert bar.endswith("return=30, eval_return=200, loss=0.1667]"), bar
    assert "time" not in bar.split("step/s")[-1]


def test_log_record_during_a_step_gets_a_line_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)  # the bar and the rlinf logger's handler
    log = get_logger("rlinf.test_progress")
    with (
        MetricLogger(tmp_path, "run", backends=()) as metrics,
        training_console(metrics, total=3, desc="train", watch=WATCH, summary_interval=1) as c,
    ):
        c.step(step_metrics(1), 1)
        log.warning("an eval starts")
        c.step(step_metrics(2), 2)
    lines = screen(tty.getvalue())
    record = [line for line in lines if "an eval starts" in line]
    assert len(record) == 1, lines
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d WARNING an eval starts", record[0])
    bars = [line for line in lines if line.startswith("train:")]
    assert bars and all("WARNING" not in line for line in bars), lines
    assert "2/3" in lines[-1]  # the bar is redrawn below the record


def test_without_a_terminal_no_bar_and_a_summary_every_interval(
    tmp_path: Path, rlinf_caplog: pytest.LogCaptureFixture
) -> None:
    log_file = io.StringIO()
    with (
        MetricLogger(tmp_path, "run", backends=()) as metrics,
        training_console(
            metrics, total=7, desc="train", watch=WATCH, summary_interval=3, file=log_file
        ) as console,
    ):
        assert console.bar.disabled
        for step in range(1, 8):
            console.step(step_metrics(step), step)
    assert log_file.getvalue() == ""
    lines = summary_lines(rlinf_caplog)
    assert [line.split(" |")[0] for line in lines] == ["step 3", "step 6", "step 7"]
    assert lines[1] == (
        "step 6 | train: loss=0.08333 | eval: return=600 | env: return=60 | time: step=0.25s"
    )


def test_on_a_terminal_the_bar_replaces_the_summary_lines(
    tmp_path: Path, rlinf_caplog: pytest.LogCaptureFixture
) -> None:
    with (
        MetricLogger(tmp_path, "run", backends=()) as metrics,
        training_console(
            metrics, total=4, desc="train", watch=WATCH, summary_interval=2, file=FakeTTY()
        ) as console,
    ):
        for step in range(1, 5):
            console.step(step_metrics(step), step)
    assert summary_lines(rlinf_caplog) == []


def test_every_metric_reaches_the_backends(tmp_path: Path) -> None:
    logged: list[tuple[int, dict[str, float]]] = []

    class Recorder(MetricLogger):
        def log(
            self, metrics: Mapping[str, object], step: int, *, summarize: bool | None = None
        ) -> None:
            logged.append((step, dict(metrics)))  # type: ignore[arg-type]

    with training_console(
        Recorder(tmp_path, "run", backends=()),
        total=2,
        desc="train",
        watch=WATCH,
        summary_interval=5,
        file=FakeTTY(),
    ) as console:
        console.step(step_metrics(1), 1)
        console.step(step_metrics(2), 2)
    assert logged == [(1, step_metrics(1)), (2, step_metrics(2))]


def test_summary_interval_must_be_positive(tmp_path: Path) -> None:
    with (
        MetricLogger(tmp_path, "run", backends=()) as metrics,
        pytest.raises(ValueError, match="summary_interval must be >= 1, got 0"),
    ):
        training_console(metrics, total=2, desc="x", watch={}, summary_interval=0)
