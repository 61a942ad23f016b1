"""The inference proxy's added latency per request (p50, p99), in one run.

A `ductor dev` process (SQLite, a fresh data dir) and the scripted upstream of
the tests (tests/ai_upstream.py, on 127.0.0.1) are started; one client then
sends the same chat completion alternately straight to the upstream and
through Ductor (`POST /v1/ai/chat/completions`: key check, body check,
connection load and decryption, budget admission, the outbound guard, the
record and the meters). The upstream answers at once, so the difference is
what the proxy adds. Streams are measured the same way, to the last byte. A
floor is measured too: `GET /v1/ai/settings`, an authenticated one-row read.

    uv run python bench/ai_proxy.py [--requests 300]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from ai_upstream import UPSTREAM_KEY, ScriptedUpstream

from ductor_server.testing import free_port

BODY = {"model": "echo", "messages": [{"role": "user", "content": "hello"}]}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start_server(data_dir: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ductor_server.cli",
            "dev",
            "--port",
            str(port),
            "--data-dir",
            str(data_dir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("the server did not start")
        time.sleep(0.2)
    return proc, url, (data_dir / "api_key").read_text().strip()


def measure(requests: int) -> None:
    upstream = ScriptedUpstream().start()
    upstream.quiet = True
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, key = start_server(Path(tmp) / "data")
        try:
            with (
                httpx.Client(
                    base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30
                ) as ductor,
                httpx.Client(
                    base_url=upstream.url,
                    headers={"Authorization": f"Bearer {UPSTREAM_KEY}"},
                    timeout=30,
                ) as direct,
            ):
                ductor.post(
                    "/v1/connections",
                    json={
                        "name": "llm",
                        "provider": "openai",
                        "config": {"base_url": upstream.url},
                        "secrets": {"api_key": UPSTREAM_KEY},
                    },
                ).raise_for_status()
                ductor.put("/v1/ai/settings", json={"default_connection": "llm"})
                ductor.put("/v1/ai/prices/echo", json={"input_per_million": 1_000_000})
                floor = []
                for i in range(requests + 20):
                    started = time.perf_counter()
                    ductor.get("/v1/ai/settings").raise_for_status()
                    if i >= 20:
                        floor.append((time.perf_counter() - started) * 1000)
                print(
                    f"floor  n={len(floor)}  GET /v1/ai/settings (key check + one read)"
                    f" p50 {percentile(floor, 0.5):6.2f} ms p99 {percentile(floor, 0.99):6.2f} ms"
                )
                for stream in (False, True):
                    body = {**BODY, "stream": stream}
                    times: dict[str, list[float]] = {"direct": [], "proxy": []}
                    for i in range(requests + 20):
                        for name, client, path in (
                            ("direct", direct, "/chat/completions"),
                            ("proxy", ductor, "/v1/ai/chat/completions"),
                        ):
                            started = time.perf_counter()
                            answer = client.post(path, json=body)
                            answer.read()
                            elapsed = (time.perf_counter() - started) * 1000
                            assert answer.status_code == 200, answer.text
                            if i >= 20:  # warm-up left out
                                times[name].append(elapsed)
                    report("stream" if stream else "whole", times)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            upstream.stop()


def report(kind: str, times: dict[str, list[float]]) -> None:
    direct, proxy = times["direct"], times["proxy"]
    added = [p - d for p, d in zip(proxy, direct, strict=True)]
    print(
        f"{kind:6} n={len(proxy)}"
        f"  direct p50 {percentile(direct, 0.5):6.2f} ms p99 {percentile(direct, 0.99):6.2f} ms"
        f"  via Ductor p50 {percentile(proxy, 0.5):6.2f} ms p99 {percentile(proxy, 0.99):6.2f} ms"
        f"  added p50 {percentile(added, 0.5):6.2f} ms p99 {percentile(added, 0.99):6.2f} ms"
        f"  (mean {statistics.fmean(added):.2f} ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    measure(args.requests)


if __name__ == "__main__":
    main()
