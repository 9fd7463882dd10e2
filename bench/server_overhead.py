"""What the connection guard costs per request: the same worker app on uvicorn's stock httptools
protocol and on the guarded one (`adapters/http/guarded_protocol.py`), driven by `wrk`.

Both servers run side by side (same model, result cache off, one forward thread); rounds
alternate stock and guarded so drift on a shared machine hits both. Two loads: `GET
/health/live` (no model work: the protocol's share is largest there) and small `POST
/v1/embeddings` requests with varied bodies (a Lua script). Prints per load the medians over the
rounds of requests/s, p50 and p99 latency, the server's CPU time per request (utime + stime from
/proc, the figure least disturbed by other load) and the ratios guarded / stock.

    python bench/server_overhead.py [--model PATH|NAME] [--rounds 4] [--seconds 5] [--connections 8]

Needs `wrk` (Debian: `apt-get install -y wrk`).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _load import free_port

POST_SCRIPT = """
local n = 0
request = function()
  n = n + 1
  local body = '{"input": "overhead request ' .. n .. ' ' .. math.random(1, 1000000) .. '"}'
  return wrk.format("POST", "/v1/embeddings", {["Content-Type"] = "application/json"}, body)
end
"""


def serve(kind: str, model: str, port: int) -> None:
    """Child mode: the worker app on the stock or the guarded protocol."""
    import uvicorn

    from vllm_srun.adapters.config.settings import WorkerSettings
    from vllm_srun.adapters.http.guarded_protocol import uvicorn_config
    from vllm_srun.adapters.http.listeners import bind_tcp
    from vllm_srun.app.bootstrap import bootstrap_worker

    container = bootstrap_worker(WorkerSettings(models=(str(model),), threads=1, result_cache_entries=0))
    app = container.app()
    options = {"lifespan": "on", "log_level": "warning", "timeout_graceful_shutdown": 5}
    if kind == "guarded":
        config = uvicorn_config(app, container.connection_guard(), **options)
    else:
        config = uvicorn.Config(
            app, loop="uvloop", http="httptools", access_log=False, timeout_keep_alive=30, **options
        )
    uvicorn.Server(config).run(sockets=[bind_tcp("127.0.0.1", port)])


@dataclass
class Run:
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_us: float  # server CPU per request


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def wrk(url: str, pid: int, seconds: int, connections: int, script: str | None) -> Run:
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency"]
    if script:
        argv += ["-s", script]
    before = cpu_seconds(pid)
    out = subprocess.run([*argv, url], capture_output=True, text=True, check=True).stdout
    used = cpu_seconds(pid) - before
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk saw errors:\n{out}")
    latency = dict(re.findall(r"^\s+(50|99)%\s+(\S+)$", out, re.M))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    return Run(rps, _ms(latency["50"]), _ms(latency["99"]), used / max(requests, 1) * 1e6)


def start(kind: str, model: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind, "--model", model, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 180
    import urllib.request

    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the {kind} server did not start")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a package path or store name (default: a tiny fixture)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--serve", choices=("stock", "guarded"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.model, args.port)
        return
    if shutil.which("wrk") is None:
        sys.exit("server_overhead: needs wrk (apt-get install -y wrk)")
    with tempfile.TemporaryDirectory(prefix="srun-overhead-") as tmp:
        model = args.model
        if model is None:
            from vllm_srun.app.fixtures import write_fixture

            model = str(write_fixture(Path(tmp) / "tiny-embed", "encoder", "embed", 0))
        script = Path(tmp) / "post.lua"
        script.write_text(POST_SCRIPT)
        servers = {kind: start(kind, model) for kind in ("stock", "guarded")}
        print(
            f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} (1, 5 min); {os.cpu_count()} CPUs; model {model}"
        )
        try:
            for load, path, lua in (
                ("GET /health/live", "/health/live", None),
                ("POST /v1/embeddings", "/", str(script)),
            ):
                runs: dict[str, list[Run]] = {"stock": [], "guarded": []}
                for _ in range(args.rounds):
                    for kind, (proc, port) in servers.items():
                        url = f"http://127.0.0.1:{port}{path}"
                        runs[kind].append(wrk(url, proc.pid, args.seconds, args.connections, lua))
                med = {
                    kind: Run(
                        *(statistics.median(getattr(r, f) for r in rs) for f in ("rps", "p50_ms", "p99_ms", "cpu_us"))
                    )
                    for kind, rs in runs.items()
                }
                s, g = med["stock"], med["guarded"]
                print(f"\n{load}: wrk -t1 -c{args.connections}, {args.rounds} rounds of {args.seconds} s, medians")
                print(f"  {'':8} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU us/req':>11}")
                for kind, r in med.items():
                    print(f"  {kind:8} {r.rps:9.0f} {r.p50_ms:8.3f} {r.p99_ms:8.3f} {r.cpu_us:11.1f}")
                print(
                    f"  guarded/stock: throughput {g.rps / s.rps:.3f}, p50 {g.p50_ms / s.p50_ms:.3f}, "
                    f"CPU per request {g.cpu_us / s.cpu_us:.3f} ({g.cpu_us - s.cpu_us:+.1f} us)"
                )
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(30)


if __name__ == "__main__":
    main()
