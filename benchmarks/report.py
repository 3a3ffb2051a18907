"""Runs the channel benchmark matrix and prints one table of medians.

    uv run python benchmarks/report.py [--quick] [--json out.json]

Rows are (pattern, payload, size); columns are transports. Round trips show
us per round trip, streaming shows GB/s (kmsg/s for the size-less ``meta``
payload). Next to each baseline, ``xN`` is how many times better ours is:
baseline_us / ours_us for round trips, ours_GBps / baseline_GBps for
streaming (> 1: ours wins). See README.md for the method.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from typing import Any

from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chbench.harness import (
    BASELINES,
    IMPLS,
    PATTERNS,
    RAY_IMPLS,
    Result,
    bench_namespace,
    env_info,
    open_peer,
    run_cell,
    skip_reason,
)
from chbench.payloads import KINDS, SIZES, cases, fmt_size

QUICK_KINDS = ["bytes", "numpy", "meta"]
SHORT = {"ray_actor_queue": "ray_actor_q", "ray_put_get": "ray_put_get"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark our shared-memory Channel against baselines; print one table.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"payloads {QUICK_KINDS} only and a short budget per cell (~2-3 min)",
    )
    p.add_argument("--json", metavar="OUT", help="also write every result (and env) here")
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=IMPLS, metavar="IMPL")
    p.add_argument("--kinds", nargs="+", choices=KINDS, metavar="KIND", help="payload kinds")
    p.add_argument("--sizes", nargs="+", type=int, metavar="BYTES", help=f"default {SIZES}")
    p.add_argument("--patterns", nargs="+", choices=PATTERNS, default=PATTERNS)
    p.add_argument("--budget", type=float, metavar="S", help="seconds per cell (0.4; quick 0.15)")
    p.add_argument("--no-ray", action="store_true", help="skip the Ray baselines (~10 s start)")
    args = p.parse_args(argv)
    args.kinds = args.kinds or (QUICK_KINDS if args.quick else KINDS)
    args.sizes = args.sizes or SIZES
    args.budget = args.budget or (0.15 if args.quick else 0.4)
    args.min_rounds = 3 if args.quick else 5
    args.max_rounds = 300 if args.quick else 1000
    if args.no_ray:
        args.impls = [i for i in args.impls if i not in RAY_IMPLS]
    if "ours" not in args.impls:
        args.impls = ["ours", *args.impls]
    return args


def plan(args: argparse.Namespace) -> list[tuple[str, str, str, int | None]]:
    """Every (impl, pattern, kind, size) to run, in run order (Ray last).

    memcpy copies bytes whatever the payload, so it runs once per size.
    """
    cells = []
    for impl in sorted(args.impls, key=lambda i: (i in RAY_IMPLS, IMPLS.index(i))):
        kinds = ["numpy"] if impl == "memcpy" else args.kinds
        for kind, size in cases(kinds, args.sizes):
            cells.extend((impl, pattern, kind, size) for pattern in args.patterns)
    return cells


class PeerPool:
    """Keeps one transport's child running while its cells run."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.impl: str | None = None
        self.peer: Any = None

    def get(self, impl: str) -> Any:
        if self.impl != impl:
            self.close()
            self.peer, self.impl = open_peer(impl, self.namespace), impl
        return self.peer

    def close(self) -> None:
        peer, self.peer, self.impl = self.peer, None, None
        if peer is not None:
            peer.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    cells = plan(args)
    results: list[Result] = []
    skipped: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        pool = PeerPool(stack.enter_context(bench_namespace()))
        stack.callback(pool.close)  # runs before the namespace check
        bar = stack.enter_context(tqdm(total=len(cells), unit="cell", mininterval=1.0))
        ray_up = False
        for impl, pattern, kind, size in cells:
            bar.set_postfix_str(f"{impl} {pattern} {kind} {fmt_size(size)}")
            where = dict(impl=impl, pattern=pattern, kind=kind, size=size)
            reason = skip_reason(impl, pattern, kind, size)
            if reason:
                skipped.append({**where, "reason": reason})
                bar.update()
                continue
            if impl in RAY_IMPLS and not ray_up:
                from chbench.ray_transports import ray_session

                pool.close()  # the ray session must outlive every Ray peer
                stack.enter_context(ray_session())
                stack.callback(pool.close)
                ray_up = True
            try:
                peer = pool.get(impl)
                budget = (args.budget, args.min_rounds, args.max_rounds)
                results.append(run_cell(peer, pattern, kind, size, *budget))
            except Exception as err:
                errors.append({**where, "error": repr(err)})
                tqdm.write(f"ERROR {impl} {pattern} {kind} {fmt_size(size)}")
                tqdm.write(traceback.format_exc())
                with contextlib.suppress(Exception):
                    pool.close()  # its state is unknown: the next cell starts a fresh child
            bar.update()
    return {
        "env": env_info(),
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "elapsed_s": time.perf_counter() - started,
        "results": [r.as_dict() for r in results],
        "skipped": skipped,
        "errors": errors,
    }


def fmt_value(v: float) -> str:
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 0.01:
        return f"{v:.3g}" if v < 1 else f"{v:.2f}"
    return f"{v:.2g}"


def fmt_ratio(r: float) -> str:
    if r >= 10:
        return f"x{r:.0f}"
    return f"x{r:.1f}" if r >= 1 else f"x{r:.2f}"


def advantage(pattern: str, ours: float, other: float) -> float:
    """How many times better ours is (> 1: ours wins)."""
    return other / ours if pattern == "roundtrip" else ours / other


def table(report: dict[str, Any]) -> str:
    by_key: dict[tuple[str, str, int | None], dict[str, dict[str, Any]]] = {}
    memcpy: dict[tuple[str, int | None], dict[str, Any]] = {}
    for r in report["results"]:
        if r["impl"] == "memcpy":
            memcpy[(r["pattern"], r["size"])] = r
            continue
        by_key.setdefault((r["pattern"], r["kind"], r["size"]), {})[r["impl"]] = r
    skipped = {(s["impl"], s["pattern"], s["kind"], s["size"]) for s in report["skipped"]}
    errors = {(e["impl"], e["pattern"], e["kind"], e["size"]) for e in report["errors"]}
    impls = [i for i in IMPLS if i in report["config"]["impls"]]
    baselines = [i for i in BASELINES if i in impls]

    header = ["pattern", "payload", "size", "unit", "ours", *(SHORT.get(b, b) for b in baselines)]
    rows = [header]
    for (pattern, kind, size), got in by_key.items():
        ours = got.get("ours")
        unit = ours["unit"] if ours else next(iter(got.values()))["unit"]
        row = [pattern, kind, fmt_size(size), unit, fmt_value(ours["value"]) if ours else "-"]
        for b in baselines:
            r = memcpy.get((pattern, size)) if b == "memcpy" and kind != "meta" else got.get(b)
            if r is None:
                row.append(_missing((b, pattern, kind, size), skipped, errors))
            elif ours is None:
                row.append(fmt_value(r["value"]))
            else:
                ratio = advantage(pattern, ours["value"], r["value"])
                row.append(f"{fmt_value(r['value'])} {fmt_ratio(ratio)}")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(_align(row, widths)) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def _align(row: list[str], widths: list[int]) -> list[str]:
    """Left-aligns the three key columns, right-aligns the numbers."""
    return [
        c.ljust(w) if i < 3 else c.rjust(w)
        for i, (c, w) in enumerate(zip(row, widths, strict=True))
    ]


def _missing(key: tuple[Any, ...], skipped: set[Any], errors: set[Any]) -> str:
    if key in errors:
        return "ERR"
    return "skip" if key in skipped or key[0] == "memcpy" else "-"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    env = report["env"]
    print(
        f"\n{env.get('cpu', '?')}, {env['nproc']} cpus, kernel {env['kernel']}, "
        f"loadavg {env['loadavg'][0]:.2f}, {report['elapsed_s']:.0f} s, budget {args.budget} s/cell"
    )
    print("round trips: us (lower is better); stream: GB/s or kmsg/s (higher is better)")
    print("xN next to a baseline: how many times better ours is (>1: ours wins)\n")
    print(table(report))
    for s in report["skipped"]:
        print(
            f"skipped {s['impl']} {s['pattern']} {s['kind']} {fmt_size(s['size'])}: {s['reason']}"
        )
    for e in report["errors"]:
        print(f"ERROR {e['impl']} {e['pattern']} {e['kind']} {fmt_size(e['size'])}: {e['error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"\nwrote {args.json}")
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
