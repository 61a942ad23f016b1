"""Route + settle latency against route alone, in a real server process (p50, p99).

A `ductor serve` process on a freshly migrated PostgreSQL database (or `ductor
dev` on SQLite) routes leads, one after another, through the three auction
pools of `routing_server.py` (100 buyers). In interleaved rounds the pools' settlement
is off (route alone: decision, reservations, assignment) and on (the same,
plus the buyers' wallets read into the snapshot and the charge entry and its
signed receipt written in the commit). Printed: the latencies of each and the
ratio of their medians.

    uv run python bench/settle_route.py [--decisions 300] [--rounds 3]
                                        [--backend postgres|sqlite|both]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from pathlib import Path

import httpx
from routing_server import POOLS, Server, config, lead, percentile, timed

USD = 1_000_000


def _setup(http: httpx.Client, buyers: int) -> None:
    workers, pools, rules = config(buyers)
    for w in workers:
        http.post("/v1/workers", json=w).raise_for_status()
    for p in pools:
        http.post("/v1/pools", json=p).raise_for_status()
    http.post("/v1/rules", json=rules).raise_for_status()
    accounts = [
        ("cash", "asset"),
        ("payable:sellers", "liability"),
        ("revenue:platform", "revenue"),
    ]
    for code, kind in accounts:
        body = {"code": code, "currency": "USD", "kind": kind}
        http.post("/v1/accounts", json=body).raise_for_status()
    for w in workers:
        wallet = f"wallet:{w['id']}"
        http.post(
            "/v1/accounts",
            json={"code": wallet, "currency": "USD", "kind": "liability", "floor": 0},
        ).raise_for_status()
        funds = 10_000_000 * USD
        http.post(
            "/v1/ledger/entries",
            json={
                "postings": [
                    {"account": "cash", "amount": funds, "currency": "USD"},
                    {"account": wallet, "amount": -funds, "currency": "USD"},
                ]
            },
        ).raise_for_status()


def _settle(http: httpx.Client, enabled: bool) -> None:
    for pool in POOLS:
        body = {
            "enabled": enabled,
            "currency": "USD",
            "take_rate_bps": 1000,
            "seller_account": "payable:sellers",
            "platform_account": "revenue:platform",
        }
        http.put(f"/v1/pools/{pool}/settlement", json=body).raise_for_status()


def run(backend: str, buyers: int, decisions: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, Server(backend, Path(tmp) / "data") as server:
        headers = {"Authorization": f"Bearer {server.api_key()}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
            _setup(http, buyers)
            rng = random.Random(3)
            counter = iter(range(10**9))

            def route() -> None:
                http.post("/v1/route", json=lead(next(counter), rng)).raise_for_status()

            alone: list[float] = []
            settled: list[float] = []
            for r in range(rounds):
                _settle(http, enabled=False)
                timed(route, 30 if r == 0 else 5)  # warm: router compiled
                alone += timed(route, decisions)
                _settle(http, enabled=True)
                timed(route, 5)
                settled += timed(route, decisions)
            entries = http.get("/v1/ledger/entries", params={"account": "revenue:platform"})
            assert len(entries.json()["items"]) > 0, "nothing was settled"
    a50, a99 = percentile(alone, 0.5), percentile(alone, 0.99)
    s50, s99 = percentile(settled, 0.5), percentile(settled, 0.99)
    print(f"[{backend}] {decisions * rounds} sequential decisions each way, {buyers} buyers")
    for name, values, p50, p99 in (
        ("route alone   ", alone, a50, a99),
        ("route + settle", settled, s50, s99),
    ):
        mean = statistics.fmean(values)
        print(f"  {name}  p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  mean {mean:.2f} ms")
    print(f"  settle / alone: p50 {s50 / a50:.2f}x, p99 {s99 / a99:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=300)
    parser.add_argument("--buyers", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="postgres")
    args = parser.parse_args()
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    for backend in backends:
        run(backend, args.buyers, args.decisions, args.rounds)


if __name__ == "__main__":
    main()
