"""What tracing costs: the same worker app with tracing off (the no-op port, the default) and on
(the OpenTelemetry SDK, every request sampled, spans batched to an exporter that drops them, so
the SDK's cost is measured and no collector's), side by side in one process.

Both apps serve the same model (result cache off, one forward thread) and are driven in-process
(httpx over ASGI, CONCURRENCY requests in flight, small varied `POST /v1/embeddings` bodies);
rounds alternate off and on so drift on a shared machine hits both. Prints per variant the median
requests/s over the rounds and the ratio on ÷ off, then the no-op port's own cost per request
(the hooks tracing off still runs: the timing fields, the time stamps, the front's header scan)
timed alone and as a share of one request's time: the figure for "off costs ≤ 2 % against the
code without tracing", which cannot run in the same process.

    python bench/tracing.py [--model PATH|NAME] [--rounds 4] [--seconds 3] [--concurrency 16]

Needs the `tracing` extra (`pip install -e '.[tracing]'`).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build(model: str, tracer: Any) -> Any:
    from vllm_srun.adapters.config.settings import WorkerSettings
    from vllm_srun.app.bootstrap import bootstrap_worker

    settings = WorkerSettings(models=(model,), threads=1, result_cache_entries=0)
    return bootstrap_worker(settings, tracer=tracer, check_golden=False).app()


def tracers() -> dict[str, Any]:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from vllm_srun.adapters.tracing.otel import tracer_with
    from vllm_srun.adapters.tracing.port import NOOP

    class Dropped(SpanExporter):
        """Counts the spans and drops them: the SDK's cost without a collector's."""

        spans = 0

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            Dropped.spans += len(spans)
            return SpanExportResult.SUCCESS

    return {"off": NOOP, "on": tracer_with([BatchSpanProcessor(Dropped())])}


async def drive(client: Any, seconds: float, concurrency: int, round_no: int) -> float:
    """Requests/s of CONCURRENCY loops posting for SECONDS."""
    done = 0
    stop = time.perf_counter() + seconds

    async def loop(k: int) -> None:
        nonlocal done
        n = 0
        while time.perf_counter() < stop:
            n += 1
            body = {"input": f"tracing overhead {round_no} {k} {n} " + "word " * (n % 12)}
            answer = await client.post("/v1/embeddings", json=body)
            assert answer.status_code == 200, answer.text
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(loop(k) for k in range(concurrency)))
    return done / (time.perf_counter() - start)


def noop_cost_s(iterations: int = 200_000) -> float:
    """Seconds per request that tracing off adds to the code without it: RequestTiming's extra
    fields (timed against a record of the fields it had before), three time stamps (admission,
    serialize start and end; the forward's is per forward), the middleware's check and the front's
    pass-through scan of a request's headers."""
    from dataclasses import dataclass, field

    from vllm_srun.adapters.request_timing import RequestTiming
    from vllm_srun.adapters.tracing.port import NOOP

    perf = time.perf_counter

    @dataclass(slots=True)
    class Before:  # RequestTiming as it was before tracing
        start: float = field(default_factory=perf)
        parse_ms: float = 0.0
        queue_ms: float = 0.0
        forward_ms: float = 0.0

    scope = {"headers": [(b"host", b"x"), (b"content-type", b"application/json"), (b"content-length", b"40")]}

    def before() -> float:
        start = perf()
        for _ in range(iterations):
            Before()
        return perf() - start

    def now() -> float:
        start = perf()
        for _ in range(iterations):
            timing = RequestTiming()
            timing.admitted = perf()
            timing.encode_start = perf()
            timing.encode_end = perf()
            if NOOP.enabled:
                raise AssertionError
            NOOP.front_request(scope).context_headers(scope)
        return perf() - start

    added = min(now() for _ in range(3)) - min(before() for _ in range(3))
    return max(0.0, added) / iterations


async def run(model: str, rounds: int, seconds: float, concurrency: int) -> None:
    from litestar.testing import AsyncTestClient

    apps = {name: build(model, tracer) for name, tracer in tracers().items()}
    rates: dict[str, list[float]] = {name: [] for name in apps}
    clients = {name: AsyncTestClient(app=app, timeout=60) for name, app in apps.items()}
    for client in clients.values():
        await client.__aenter__()
    try:
        for name, app in apps.items():  # loaded, warmed
            await asyncio.to_thread(app.state.runtime.loaded.wait, 300)
            await drive(clients[name], min(1.0, seconds), concurrency, -1)
        for r in range(rounds):
            order = ("off", "on") if r % 2 == 0 else ("on", "off")
            for name in order:
                rates[name].append(await drive(clients[name], seconds, concurrency, r))
    finally:
        for client in clients.values():
            await client.__aexit__(None, None, None)
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    print(f"off: {off:9.1f} req/s   (rounds: {', '.join(f'{x:.1f}' for x in rates['off'])})")
    print(f"on:  {on:9.1f} req/s   (rounds: {', '.join(f'{x:.1f}' for x in rates['on'])})")
    print(f"on / off: {on / off:.3f}")
    cost = noop_cost_s()
    print(
        f"no-op port: {cost * 1e9:.0f} ns per request = {cost * off * 100:.4f} % of one request's time at {off:.0f} req/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default=None, help="a package path or store name (default: a tiny fixture)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    print(f"load before: {Path('/proc/loadavg').read_text().strip() if Path('/proc/loadavg').exists() else '?'}")
    with tempfile.TemporaryDirectory(prefix="srun-tracing-") as tmp:
        model = args.model
        if model is None:
            from vllm_srun.app.fixtures import write_fixture

            model = str(write_fixture(Path(tmp) / "tiny-embed", "encoder", "embed", 0))
        asyncio.run(run(model, args.rounds, args.seconds, args.concurrency))
    print(f"load after: {Path('/proc/loadavg').read_text().strip() if Path('/proc/loadavg').exists() else '?'}")


if __name__ == "__main__":
    main()
