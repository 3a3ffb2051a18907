"""The full matrix with pytest-benchmark (slow: deselected by default).

    uv run pytest benchmarks/test_channel_matrix.py -m slow [--benchmark-json out.json]

impl x pattern x payload x size, every number cross-process (a spawned child
or a Ray actor consumes). Each transport's child starts once (module-scoped
fixture) and serves all of its cells; pytest groups the tests by transport.
A cell warms up (which also faults in every buffer the steady state reuses),
then ``benchmark.pedantic`` times one round trip or one streaming batch per
round, with rounds calibrated so a cell takes about ``BUDGET_S``. The
headline number (us per round trip, GB/s or kmsg/s streaming) is stored in
``extra_info``. ``report.py`` prints the same matrix as one table.
"""

import pytest
from chbench.harness import (
    IMPLS,
    PATTERNS,
    RAY_IMPLS,
    env_info,
    headline,
    peer,
    plan_rounds,
    prepare,
    skip_reason,
    warm_up,
)
from chbench.payloads import cases, fmt_size

pytestmark = pytest.mark.slow

BUDGET_S = 0.4
MIN_ROUNDS = 5
MAX_ROUNDS = 1000
CASES = cases()


@pytest.fixture(scope="module")
def ray_cluster():
    from chbench.ray_transports import ray_session

    with ray_session():
        yield


@pytest.fixture(scope="module", params=IMPLS)
def bench_peer(request, namespace):
    if request.param in RAY_IMPLS:
        request.getfixturevalue("ray_cluster")
    with peer(request.param, namespace) as p:
        yield p


@pytest.mark.parametrize(("kind", "size"), CASES, ids=[f"{k}-{fmt_size(s)}" for k, s in CASES])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_matrix(benchmark, bench_peer, pattern, kind, size):
    impl = bench_peer.name
    reason = skip_reason(impl, pattern, kind, size)
    if reason:
        pytest.skip(reason)
    if impl == "memcpy" and kind != "numpy":
        pytest.skip("memcpy copies bytes whatever the payload: see its numpy row")
    cell = prepare(bench_peer, pattern, kind, size)
    per_round = warm_up(cell.fn, BUDGET_S, MAX_ROUNDS)
    rounds = plan_rounds(per_round, BUDGET_S, MIN_ROUNDS, MAX_ROUNDS)
    benchmark.group = f"{pattern} {kind} {fmt_size(size)}"
    benchmark.extra_info.update(
        impl=impl,
        pattern=pattern,
        kind=kind,
        size=size,
        items_per_round=cell.items_per_round,
        bytes_per_round=cell.bytes_per_round,
        env=env_info(),
    )
    benchmark.pedantic(cell.fn, rounds=rounds, iterations=1, warmup_rounds=0)
    if benchmark.stats is not None:  # None under --benchmark-disable
        value, unit = headline(pattern, benchmark.stats.stats.median, cell)
        benchmark.extra_info.update(value=value, unit=unit)
