"""`tk bench --serve`: concurrent clients on loopback against `tk serve`, dynamic batching on vs off.

Each mode gets its own server process (same model, same options but --no-batching), warmed up,
then `clients` clients each send single sentences back to back until the list is used up.
`tk bench --serve --ray` compares `tk serve` with `tk serve --ray` (1 and 2 replicas) the same way.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from toolkit.core.errors import ToolkitError


@dataclass
class LoadResult:
    mode: str
    clients: int
    sentences: int
    errors: int
    seconds: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_batch: float

    @property
    def throughput(self) -> float:
        return self.sentences / self.seconds


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def start_server(model_dir: Path, args: list[str]) -> tuple[subprocess.Popen, str]:
    # stdout unread: tk serve writes nothing there, and with --ray, Ray's notices go there, not into the table.
    proc = subprocess.Popen([sys.executable, "-m", "toolkit.cli", "serve", str(model_dir), "--port", "0", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        found = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
        if found:
            # Drain the log so the server never blocks on a full pipe.
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, found.group(1)
    raise ToolkitError(f"tk serve {model_dir} did not start (exit {proc.wait()})")


async def post(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes, host: str) -> int:
    """One keep-alive HTTP/1.1 POST to host (host:port, as the Host header); returns the status. Raw
    sockets: a client library would take a good share of the two cores the server is measured on."""
    writer.write(b"POST /v1/translate HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (host.encode(), len(body), body))
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    await reader.readexactly(length)
    return int(head.split(b" ", 2)[1])


async def drive(url: str, sentences: list[str], clients: int, beam: int) -> tuple[list[float], int, float]:
    """Latencies (s), errors and wall time of sending every sentence, one per request."""
    host, port = url.removeprefix("http://").split(":")
    queue = iter(sentences)
    latencies: list[float] = []
    errors = 0

    async def client() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            for text in queue:
                start = time.perf_counter()
                status = await post(reader, writer, json.dumps({"text": text, "beam": beam}).encode(), f"{host}:{port}")
                latencies.append(time.perf_counter() - start)
                errors += status != 200
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies, errors, time.perf_counter() - start


def batch_totals(url: str) -> tuple[float, float]:
    """(sentences decoded, decodes) so far, from the server's /metrics."""
    samples = {s.name: s.value for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text) for s in f.samples}
    return samples["tk_batch_sentences_sum"], samples["tk_batch_sentences_count"]


def measure(model_dir: Path, sentences: list[str], clients: int, beam: int, batching: bool, server_args: list[str],
            mode: str | None = None) -> LoadResult:
    """One server's row; mode: its name in the table [default: by batching]. "mean batch" is NaN where the server's
    /metrics counts no decodes (tk serve --ray's ingress: its replicas decode)."""
    args = [*server_args, "--queue-size", str(max(1024, 2 * clients))] + ([] if batching else ["--no-batching"])
    proc, url = start_server(model_dir, args)
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        asyncio.run(drive(url, sentences[: 4 * clients], clients, beam))  # warm-up: connections, session arenas
        done, decodes = batch_totals(url)
        latencies, errors, seconds = asyncio.run(drive(url, sentences, clients, beam))
        done_after, decodes_after = batch_totals(url)
        return LoadResult(mode or ("dynamic batching" if batching else "batching off"), clients, len(sentences), errors, seconds,
                          1000 * percentile(latencies, 50), 1000 * percentile(latencies, 95), 1000 * percentile(latencies, 99),
                          (done_after - done) / (decodes_after - decodes) if decodes_after > decodes else math.nan)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def bench_serve(model_dir: Path, sentences: list[str], clients: int = 32, beam: int = 1, server_args: list[str] | None = None,
                echo: Callable[[str], None] = lambda m: None) -> list[LoadResult]:
    results = []
    for batching in (True, False):
        echo(f"{'dynamic batching' if batching else 'batching off'}: {clients} clients, {len(sentences)} sentences ...")
        results.append(measure(model_dir, sentences, clients, beam, batching, server_args or []))
    return results


def bench_serve_ray(model_dir: Path, sentences: list[str], clients: int = 32, beam: int = 1, server_args: list[str] | None = None,
                    replicas: tuple[int, ...] = (1, 2), echo: Callable[[str], None] = lambda m: None) -> list[LoadResult]:
    """tk serve on its own, then tk serve --ray (a local Ray) with each number of replicas: the same load on each."""
    modes = [("tk serve", [])] + [(f"--ray, {n} replica{'s' * (n > 1)}", ["--ray", "--replicas", str(n)]) for n in replicas]
    results = []
    for mode, args in modes:
        echo(f"{mode}: {clients} clients, {len(sentences)} sentences ...")
        results.append(measure(model_dir, sentences, clients, beam, True, [*(server_args or []), *args], mode))
    return results


def table(results: list[LoadResult]) -> str:
    width = max(18, *(len(r.mode) for r in results))
    head = (f"{'server':<{width}} {'clients':>7} {'sentences':>9} {'errors':>6} {'sent/s':>8} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} "
            f"{'mean batch':>10}")
    lines = [head, "-" * len(head)]
    for r in results:
        batch = f"{r.mean_batch:>10.1f}" if not math.isnan(r.mean_batch) else f"{'-':>10}"
        lines.append(f"{r.mode:<{width}} {r.clients:>7} {r.sentences:>9} {r.errors:>6} {r.throughput:>8.1f} {r.p50_ms:>7.1f} "
                     f"{r.p95_ms:>7.1f} {r.p99_ms:>7.1f} {batch}")
    if [r.mode for r in results] == ["dynamic batching", "batching off"] and results[1].throughput:
        lines.append(f"throughput with dynamic batching: {results[0].throughput / results[1].throughput:.2f}x batching off")
    elif len(results) > 1 and results[0].throughput:
        lines += [f"throughput of {r.mode}: {r.throughput / results[0].throughput:.2f}x {results[0].mode}" for r in results[1:]]
    return "\n".join(lines)
