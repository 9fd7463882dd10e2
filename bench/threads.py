"""What `vllm-srun serve`'s default CPU use should be (R-CPU-1): forward threads, OpenMP wait
policy, concurrent forwards and the forward threads' priority, measured with `wrk` (a client that
takes almost no CPU from the server), one run.

Settings: `--threads 1` (the default before the whole budget, the ratios' base); for N in
2..budget one team of N with OpenMP's spinning waits (`OMP_WAIT_POLICY=ACTIVE`) and with passive
ones; the budget as teams of one side by side (`--concurrent-forwards`) at the event loop's
priority; one team at the default nice increment (`VLLM_SRUN_FORWARD_NICE`); and the default.
For each: MiniLM req/s and p50/p99 at `--connections` closed-loop connections on short and mixed
texts, `/health`'s p50/p99 while the mixed load runs (sampled by a 20 Hz probe, so it measures
the event loop's responsiveness, not the client), and a lone request's p50. Settings run in
alternating order over `--rounds` so drift hits each alike.

    python bench/threads.py [--seconds 10] [--rounds 2] [--connections 64]
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _load import LoadResult, embeddings_body, machine_load, merged, server, warm_up, wrk_load
from _texts import make_texts

from vllm_srun.domain.worker.threads import DEFAULT_FORWARD_NICE, FORWARD_NICE_ENV


class HealthProbe:
    """GET /health at a fixed rate in a thread; latencies in ms."""

    def __init__(self, base: str, hz: float = 20.0) -> None:
        host, port = base.removeprefix("http://").split(":")
        self.host, self.port, self.period = host, int(port), 1.0 / hz
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        while not self._stop.is_set():
            start = time.perf_counter()
            conn.request("GET", "/health")
            conn.getresponse().read()
            self.latencies.append((time.perf_counter() - start) * 1000)
            self._stop.wait(max(0.0, self.period - (time.perf_counter() - start)))
        conn.close()

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def pct(self, q: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--connections", type=int, default=64)
    args = ap.parse_args()
    from vllm_srun.adapters.workers.cpu_budget import front_cpu_budget
    from vllm_srun.domain.worker.threads import budget_threads

    budget = budget_threads(front_cpu_budget())
    nice0 = {FORWARD_NICE_ENV: "0"}  # forward threads at the event loop's priority
    # (name, flags, environment): the first is the baseline (one thread)
    settings: list[tuple[str, tuple[str, ...], dict[str, str]]] = [("--threads 1", ("--threads", "1"), nice0)]
    for n in range(2, budget + 1):
        one = ("--threads", str(n), "--concurrent-forwards", "1")
        settings.append((f"--threads {n} spinning", one, {**nice0, "OMP_WAIT_POLICY": "ACTIVE"}))
        settings.append((f"--threads {n} passive", one, nice0))
    if budget > 1:  # teams of one side by side, at one priority and with the forwards niced
        teams = ("--threads", str(budget), "--concurrent-forwards", str(budget))
        settings.append((f"--threads {budget} --concurrent-forwards {budget} nice 0", teams, nice0))
        settings.append((f"--concurrent-forwards 1 nice {DEFAULT_FORWARD_NICE}", ("--concurrent-forwards", "1"), {}))
    settings.append(("default", (), {}))
    bodies = {s: [embeddings_body(t) for t in make_texts(s, 512, seed=1)] for s in ("short", "mixed")}
    lone = [embeddings_body("route this request to billing")]
    print(
        f"# threads: MiniLM, wrk {args.connections} connections × {args.seconds:g} s, {args.rounds} rounds; {machine_load()}"
    )
    loaded: dict[str, dict[str, list[LoadResult]]] = {name: {"short": [], "mixed": []} for name, _, _ in settings}
    health: dict[str, list[float]] = {name: [] for name, _, _ in settings}
    lone_p50: dict[str, list[float]] = {name: [] for name, _, _ in settings}
    for round_ in range(args.rounds):
        for name, flags, env in settings if round_ % 2 == 0 else settings[::-1]:
            before = {k: os.environ.get(k) for k in (*env, "OMP_WAIT_POLICY", FORWARD_NICE_ENV)}
            os.environ.pop("OMP_WAIT_POLICY", None)
            os.environ.pop(FORWARD_NICE_ENV, None)
            os.environ.update(env)
            try:
                with server(*flags, "--result-cache-entries", "0") as base:
                    warm_up(base, lone, 1)
                    lone_p50[name].append(wrk_load(base, lone, connections=1, seconds=min(5.0, args.seconds)).p50_ms)
                    for shape in ("short", "mixed"):
                        warm_up(base, bodies[shape], 2)
                        if shape == "mixed":
                            with HealthProbe(base) as probe:
                                got = wrk_load(base, bodies[shape], connections=args.connections, seconds=args.seconds)
                            health[name].extend(probe.latencies)
                        else:
                            got = wrk_load(base, bodies[shape], connections=args.connections, seconds=args.seconds)
                        loaded[name][shape].append(got)
            finally:
                for key, value in before.items():
                    os.environ.pop(key, None)
                    if value is not None:
                        os.environ[key] = value
            print(f"  round {round_ + 1}: {name} done; {machine_load()}", flush=True)
    previous = "--threads 1"
    print(f"\n# after: {machine_load()}; ratios to {previous} (the default before R-CPU-1's whole budget)")
    print(
        f"{'setting':44s} {'short req/s':>11s} {'p99 ms':>8s} {'mixed req/s':>11s} {'p99 ms':>8s} "
        f"{'/health p50':>11s} {'p99':>7s} {'lone p50':>9s} {'short×':>7s} {'mixed×':>7s}"
    )
    base_short = merged(loaded[previous]["short"]).rps
    base_mixed = merged(loaded[previous]["mixed"]).rps
    for name, _, _ in settings:
        s, m = merged(loaded[name]["short"]), merged(loaded[name]["mixed"])
        h = sorted(health[name])
        h50 = statistics.median(h) if h else float("nan")
        h99 = h[min(len(h) - 1, int(0.99 * len(h)))] if h else float("nan")
        print(
            f"{name:44s} {s.rps:11.1f} {s.p99_ms:8.0f} {m.rps:11.1f} {m.p99_ms:8.0f} {h50:11.2f} {h99:7.2f} "
            f"{statistics.median(lone_p50[name]):9.2f} {s.rps / base_short:7.2f} {m.rps / base_mixed:7.2f}"
        )


if __name__ == "__main__":
    main()
