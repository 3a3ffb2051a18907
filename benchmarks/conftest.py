"""Fixtures of the benchmark tier: interleaved pytest-benchmark runs and the ratio table.

    uv run pytest benchmarks [--ratios-json PATH]

``chbench`` (beside this file) is put on ``sys.path``; spawned children
inherit it.

A suite measures its candidates (ours and the baselines) with ``interleave``,
which times every round with pytest-benchmark's ``benchmark.pedantic`` and
alternates between the candidates block by block, so that a burst of load
from elsewhere hits all of them alike. It then reports each ratio with one
call::

    record_ratio("64 B round trip vs mp.Queue", ours_us, queue_us, unit="us",
                 baseline_name="mp.Queue", target=6.0, floor=3.0,
                 higher_is_better=False)

At the end of the run one table lists every ratio (also when tests fail) and
the same rows are written as JSON (``benchmarks/results/ratios.json`` unless
``--ratios-json PATH``). A ratio below its floor fails its test and the run;
one between floor and target is reported as ``below target`` and passes.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chbench.harness import bench_namespace, env_info

DEFAULT_RATIOS_JSON = Path("benchmarks") / "results" / "ratios.json"


# ----- ratios -------------------------------------------------------------------------------
@dataclass
class Ratio:
    """One row of the table: ours against one baseline measured in the same run.

    ``ratio`` is how many times better ours is: ``ours / baseline`` for
    rates (``higher_is_better``), ``baseline / ours`` for times. ``target``
    and ``floor`` bound ``ratio`` from below; ``None`` for both makes an
    informational row that never fails.
    """

    name: str
    ours: float
    baseline: float
    baseline_name: str
    unit: str
    target: float | None
    floor: float | None
    higher_is_better: bool
    test: str

    @property
    def ratio(self) -> float:
        num, den = (
            (self.ours, self.baseline) if self.higher_is_better else (self.baseline, self.ours)
        )
        return num / den if den > 0 else math.inf

    @property
    def result(self) -> str:
        if self.floor is not None and not self.ratio >= self.floor:
            return "FAIL"
        if self.target is not None and not self.ratio >= self.target:
            return "below target"
        return "info" if self.target is None and self.floor is None else "pass"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "result": self.result}


_ROWS: list[Ratio] = []
_UNRECORDED: list[tuple[str, str]] = []  # (test, outcome) of tests that recorded no ratio
_STARTED: list[float] = []  # time.monotonic() at the session's start


def pytest_sessionstart(session: pytest.Session) -> None:
    """Notes when the tier started: its duration goes into the JSON."""
    _STARTED.append(time.monotonic())


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--ratios-json",
        metavar="PATH",
        default=None,
        help=f"where the benchmark tier writes its ratio table (default {DEFAULT_RATIOS_JSON})",
    )


@pytest.fixture
def record_ratio(request: pytest.FixtureRequest) -> Callable[..., Ratio]:
    """Adds a row to the ratio table; a ratio below ``floor`` fails the test (after it ends)."""

    def record(
        name: str,
        ours: float,
        baseline: float,
        *,
        unit: str,
        baseline_name: str,
        target: float | None,
        floor: float | None,
        higher_is_better: bool = True,
    ) -> Ratio:
        if target is not None and floor is not None and floor > target:
            raise ValueError(f"{name}: floor {floor} is above target {target}")
        row = Ratio(
            name=name,
            ours=float(ours),
            baseline=float(baseline),
            baseline_name=baseline_name,
            unit=unit,
            target=target,
            floor=floor,
            higher_is_better=higher_is_better,
            test=request.node.nodeid,
        )
        _ROWS.append(row)
        print(f"{row.name}: {row.ratio:.2f}x ({row.result})")
        return row

    return record


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Fails a test whose ratio fell below its floor; notes tests that recorded nothing."""
    report = yield
    if "record_ratio" not in getattr(item, "fixturenames", ()):
        return report
    rows = [r for r in _ROWS if r.test == item.nodeid]
    if call.when == "call" and report.passed:
        failed = [r for r in rows if r.result == "FAIL"]
        if failed:
            report.outcome = "failed"
            report.longrepr = "\n".join(
                f"ratio below its floor: {r.name}: {r.ratio:.2f}x < {_bound(r.floor)} "
                f"(ours {_value(r.ours, r.unit)}, {r.baseline_name} "
                f"{_value(r.baseline, r.unit)}; target {_bound(r.target)})"
                for r in failed
            )
    unrecorded = not rows and (call.when == "call" or not report.passed)
    if unrecorded and item.nodeid not in {t for t, _ in _UNRECORDED}:
        _UNRECORDED.append((item.nodeid, report.outcome))
    return report


def _value(v: float, unit: str) -> str:
    if not math.isfinite(v):
        return f"{v} {unit}"
    a = abs(v)
    text = (
        f"{v:.0f}" if a >= 100 else f"{v:.1f}" if a >= 10 else f"{v:.2f}" if a >= 1 else f"{v:.3g}"
    )
    return f"{text} {unit}"


def _bound(b: float | None) -> str:
    return "-" if b is None else f"{b:.3g}x"


def _table() -> list[str]:
    header = ("name", "ours", "baseline", "ratio", "target", "floor", "result")
    body = [
        (
            r.name,
            _value(r.ours, r.unit),
            f"{r.baseline_name} {_value(r.baseline, r.unit)}",
            f"{r.ratio:.2f}x",
            _bound(r.target),
            _bound(r.floor),
            r.result,
        )
        for r in _ROWS
    ]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    right = {1, 3, 4, 5}

    def line(row: tuple[str, ...]) -> str:
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    return [line(header), *(line(row) for row in body)]


def _outcome() -> tuple[bool, str]:
    counts = {
        k: sum(r.result == k for r in _ROWS) for k in ("pass", "below target", "FAIL", "info")
    }
    ok = counts["FAIL"] == 0
    text = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "none"
    verdict = "passed" if ok else "FAILED (a ratio is below its floor)"
    return ok, f"{len(_ROWS)} ratios: {text} -> {verdict}"


def _json_path(config: pytest.Config) -> Path:
    given = config.getoption("--ratios-json")
    return Path(given) if given else config.rootpath / DEFAULT_RATIOS_JSON


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Writes the table as JSON; a ratio below its floor fails the run."""
    if not _ROWS and not _UNRECORDED:
        return
    ok, summary = _outcome()
    if not ok and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    path = _json_path(session.config)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "args": session.config.invocation_params.args,
        "duration_s": round(time.monotonic() - _STARTED[0], 1) if _STARTED else None,
        "ratios_passed": ok,  # no ratio below its floor
        "summary": summary,
        "ratios": [r.as_dict() for r in _ROWS],
        "not_recorded": [{"test": t, "outcome": o} for t, o in _UNRECORDED],
        "machine": env_info(),
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")


@pytest.hookimpl(trylast=True)  # after pytest-benchmark's own tables
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _ROWS and not _UNRECORDED:
        return
    tr = terminalreporter
    ok, summary = _outcome()
    tr.write_sep("=", "benchmark ratios (ours vs baselines measured in the same run)", bold=True)
    tr.write_line(
        "ratio = how many times better ours is (baseline/ours for times, ours/baseline for rates)"
    )
    for line in _table():
        tr.write_line(line)
    for test, outcome in _UNRECORDED:
        tr.write_line(f"no ratio recorded by {test} ({outcome})", red=True)
    tr.write_line(summary, green=ok, red=not ok, bold=True)
    tr.write_line(f"JSON: {_json_path(tr.config)}")


# ----- measuring --------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def namespace() -> Iterator[str]:
    """A fresh channel namespace; fails the session if a segment is left in /dev/shm."""
    with bench_namespace() as ns:
        yield ns


class _Aborted(Exception):
    """Stops a candidate because another one failed."""


class _Turns:
    """Lets one candidate's thread run at a time, in a fixed cyclic order."""

    def __init__(self, n: int) -> None:
        self._cond = threading.Condition()
        self._turn = 0
        self._done = [False] * n
        self.aborted = False

    def wait(self, i: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._turn == i or self.aborted)
            if self.aborted:
                raise _Aborted

    def pass_on(self, i: int, *, done: bool = False, failed: bool = False) -> None:
        with self._cond:
            self._done[i] = self._done[i] or done
            self.aborted = self.aborted or failed
            n = len(self._done)
            nxt = [(i + k) % n for k in range(1, n + 1) if not self._done[(i + k) % n]]
            if nxt:
                self._turn = nxt[0]
            self._cond.notify_all()


BlockContext = Callable[[str], contextlib.AbstractContextManager[object]]


@pytest.fixture
def interleave(request: pytest.FixtureRequest, benchmark: Any) -> Callable[..., dict[str, Any]]:
    """Times several candidates with pytest-benchmark, alternating in blocks.

    ``interleave(fns, blocks=8, rounds=300, warmup_rounds=500)`` gives each
    candidate of ``fns`` (name -> one round, a callable) its own
    pytest-benchmark fixture and one ``pedantic`` run of ``blocks * rounds``
    rounds (plus its warm-up), and runs the candidates in turn: ``rounds``
    rounds of the first, then of the second, ..., ``blocks`` times. Only one
    candidate runs at a time (each in its own thread, the others wait
    outside the timed region). Returns name -> pytest-benchmark ``Stats``
    (``.median``, ``.min``, ``.data``: seconds per round, in order).

    ``setup`` (name -> callable) runs untimed before each round of that
    candidate. ``block_context(name)``, if given, is entered before each of
    a candidate's blocks (after its turn starts, untimed) and left after it.
    ``label`` suffixes the benchmark names (for a second measurement in one
    test). The candidates appear in pytest-benchmark's table and JSON as
    ``<test>:<name>``, grouped by test.
    """
    if benchmark.disabled:
        pytest.skip("pytest-benchmark is disabled (--benchmark-disable): no ratios to measure")
    template = copy.copy(benchmark)  # unused copy: each candidate gets a fresh one
    node = request.node
    state = {"real_used": False}

    def fixture_for(name: str) -> Any:
        if not state["real_used"]:
            state["real_used"] = True
            fx = benchmark  # the test's own fixture, so pytest-benchmark sees it used
        else:
            fx = copy.copy(template)
            fx.extra_info = {}
        fx.name = f"{node.name}:{name}"
        fx.fullname = f"{node.nodeid}:{name}"
        fx.group = node.name
        return fx

    def run(
        fns: Mapping[str, Callable[[], object]],
        *,
        blocks: int,
        rounds: int,
        warmup_rounds: int = 0,
        setup: Mapping[str, Callable[[], None]] | None = None,
        block_context: BlockContext | None = None,
        label: str = "",
    ) -> dict[str, Any]:
        names = list(fns)
        benches = {n: fixture_for(n + label) for n in names}
        turns = _Turns(len(names))
        errors: list[BaseException] = []

        def candidate(i: int, name: str) -> None:
            calls = 0
            user_setup = (setup or {}).get(name)
            with contextlib.ExitStack() as block:

                def enter_block() -> None:
                    if block_context is not None:
                        block.enter_context(block_context(name))

                def before_round() -> None:
                    nonlocal calls
                    k = calls - warmup_rounds
                    calls += 1
                    if k > 0 and k % rounds == 0:  # a block ends: hand over, wait for the turn
                        block.close()
                        turns.pass_on(i)
                        turns.wait(i)
                        enter_block()
                    if user_setup is not None:
                        user_setup()

                try:
                    turns.wait(i)
                    enter_block()
                    benches[name].pedantic(
                        fns[name],
                        setup=before_round,
                        rounds=blocks * rounds,
                        warmup_rounds=warmup_rounds,
                    )
                    block.close()
                except _Aborted:
                    turns.pass_on(i, done=True)
                    return
                except BaseException as exc:
                    errors.append(exc)
                    turns.pass_on(i, done=True, failed=True)
                    return
            turns.pass_on(i, done=True)

        threads = [
            threading.Thread(target=candidate, args=(i, n), name=f"bench-{n}", daemon=True)
            for i, n in enumerate(names)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return {n: benches[n].stats.stats for n in names}

    return run
