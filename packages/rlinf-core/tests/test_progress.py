from __future__ import annotations

import io
import re
import time

import pytest

from rlinf.core.progress import progress_bar, progress_enabled, rate_postfix, track


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
