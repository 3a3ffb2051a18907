"""Start-up phase marks and the one-line report."""

from __future__ import annotations

import subprocess
import sys
import time

from rlinf.core import startup


def test_phases_add_up_and_the_report_comes_once() -> None:
    startup.reset()
    startup.mark("imports")
    time.sleep(0.1)
    startup.mark("ray")
    reported = startup.report()
    assert reported is not None
    line, phases = reported
    assert list(phases) == ["total", "imports", "ray"]
    assert phases["ray"] >= 0.08  # /proc times tick every 10 ms
    assert phases["imports"] + phases["ray"] <= phases["total"] + 1e-6
    assert line.startswith(f"start-up: {phases['total']:.1f} s from launch to the first step (")
    assert "imports" in line and "ray" in line
    assert startup.report() is None  # once per process
    startup.reset()


def test_process_age_counts_from_the_launch() -> None:
    # A child that sleeps before importing rlinf: its age includes the sleep.
    code = (
        "import time; time.sleep(0.6); "
        "from rlinf.core import startup; print(startup.process_age_s())"
    )
    age = float(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
    )
    assert age >= 0.6
