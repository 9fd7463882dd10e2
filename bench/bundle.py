"""One `/v1/bundle` of 4 tasks against the same 4 calls, concurrently and sequentially (R-PERF-1).

One worker (`vllm-srun serve --models FILE`, result cache off, `--max-queue 1024` so that every
connection's tasks are admitted) serves the real
all-MiniLM-L6-v2 embedder and three tiny fixtures (a classifier, a multi-label classifier and a
decision model). Two sets of 4 tasks per prompt, in one run:
  - router: an embedding, two classifications and a 3-question decision about the prompt
    (four models: the bundle saves round trips and queue waits, not forwards);
  - same model: 4 embeddings of the prompt and its variants (one model: the bundle's rows
    go to the scheduler in one submit and share forwards).
For each: a lone set's latency (median and p90 of `--sets` sets, cheap asyncio client) as 4
sequential calls, 4 concurrent calls and one bundle; and sets/s under load with `wrk` (one
thread, `--connections` connections, every prompt unique) sending the 4 calls round robin
against sending bundles.

    python bench/bundle.py [--sets 60] [--seconds 12] [--connections 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _load import Connection, server

QUESTIONS = {
    "billing": {"type": "noul", "instructions": "Is this about billing?"},
    "team": {"type": "choice", "criteria": {"billing": None, "shipping": None, "other": None}},
    "urgency": {"type": "score", "criteria": ["can wait", "this week", "today"]},
}


def router_calls(prompt: str) -> list[tuple[str, str, dict[str, object]]]:
    return [
        ("/v1/embeddings", "embeddings", {"model": "minilm", "input": prompt}),
        ("/v1/classify", "classify", {"model": "tiny-classify", "input": prompt}),
        ("/v1/classify", "classify", {"model": "tiny-multilabel", "input": prompt}),
        ("/v1/decisions", "decisions", {"model": "tiny-decision-llama", "state": prompt, "questions": QUESTIONS}),
    ]


def same_model_calls(prompt: str) -> list[tuple[str, str, dict[str, object]]]:
    texts = [prompt, prompt + " please", "about: " + prompt, prompt.upper()]
    return [("/v1/embeddings", "embeddings", {"model": "minilm", "input": text}) for text in texts]


def bundle_of(calls: list[tuple[str, str, dict[str, object]]]) -> bytes:
    return json.dumps({"tasks": [{"id": str(i), surface: body} for i, (_, surface, body) in enumerate(calls)]}).encode()


def prompt(n: int) -> str:
    return f"I was charged twice for order {n}, please refund the second payment today"


async def lone_sets(base: str, make, sets: int) -> dict[str, list[float]]:  # type: ignore[no-untyped-def]
    host, port = base.removeprefix("http://").split(":")
    conns = [Connection(host, int(port)) for _ in range(4)]
    out: dict[str, list[float]] = {"sequential": [], "concurrent": [], "bundle": []}
    try:
        for n in range(sets):
            calls = make(prompt(10_000 + n))
            bodies = [(path, json.dumps(body).encode()) for path, _, body in calls]
            t0 = time.perf_counter()
            for path, body in bodies:
                assert (await conns[0].post(path, body))[0] == 200
            out["sequential"].append(time.perf_counter() - t0)
            calls = make(prompt(20_000 + n))
            bodies = [(path, json.dumps(body).encode()) for path, _, body in calls]
            t0 = time.perf_counter()
            answers = await asyncio.gather(*(c.post(p, b) for c, (p, b) in zip(conns, bodies)))
            assert all(status == 200 for status, _ in answers)
            out["concurrent"].append(time.perf_counter() - t0)
            calls = make(prompt(30_000 + n))
            t0 = time.perf_counter()
            status, payload = await conns[0].post("/v1/bundle", bundle_of(calls))
            assert status == 200 and all(r["status"] == 200 for r in json.loads(payload)["results"]), payload[:300]
            out["bundle"].append(time.perf_counter() - t0)
    finally:
        for conn in conns:
            conn.close()
    return out


LUA = r"""
local kind = "{KIND}"
local counter = 0
local calls = {CALLS}
local questions = '{QUESTIONS}'
local function text(n) return "I was charged twice for order " .. n .. ", please refund the second payment today" end
local function body(i, t)
  local c = calls[i]
  if c[2] == "decisions" then
    return '{"model": "' .. c[3] .. '", "state": "' .. t .. '", "questions": ' .. questions .. '}'
  end
  return '{"model": "' .. c[3] .. '", "input": "' .. c[4] .. t .. '"}'
end
request = function()
  counter = counter + 1
  local headers = {["Content-Type"] = "application/json"}
  if kind == "bundle" then
    local t, tasks = text(counter), {}
    for i = 1, #calls do tasks[i] = '{"id": "' .. i .. '", "' .. calls[i][2] .. '": ' .. body(i, t) .. '}' end
    return wrk.format("POST", "/v1/bundle", headers, '{"tasks": [' .. table.concat(tasks, ", ") .. ']}')
  end
  local i = (counter - 1) % #calls + 1
  return wrk.format("POST", calls[i][1], headers, body(i, text(math.floor((counter - 1) / #calls))))
end
response = function(status, headers, body)
  -- a bundle answers 200 with each task's own status inside: any task error fails the run
  if status ~= 200 or body:find('"error"', 1, true) then error("status " .. status .. ": " .. body:sub(1, 300)) end
end
"""


def lua_calls(calls: list[tuple[str, str, dict[str, object]]], prefixes: list[str]) -> str:
    items = [
        f'{{"{path}", "{surface}", "{body["model"]}", "{pre}"}}' for (path, surface, body), pre in zip(calls, prefixes)
    ]
    return "{" + ", ".join(items) + "}"


def sets_per_second(base: str, calls_lua: str, kind: str, seconds: int, connections: int) -> float:
    script = LUA.replace("{KIND}", kind).replace("{CALLS}", calls_lua).replace("{QUESTIONS}", json.dumps(QUESTIONS))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "30s", "-s", f.name, base],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if "Non-2xx" in out or "status " in out:
        raise RuntimeError(out)
    rps = float(next(line for line in out.splitlines() if line.startswith("Requests/sec")).split()[1])
    return rps if kind == "bundle" else rps / 4


def fixtures(root: Path) -> dict[str, Path]:
    made = {}
    for name, family, variant in (
        ("tiny-classify", "encoder", "classify"),
        ("tiny-multilabel", "encoder", "multilabel"),
        ("tiny-decision-llama", "decision", "llama"),
    ):
        out = root / name
        subprocess.run(
            [sys.executable, "-m", "vllm_srun.app.cli", "fixture", str(out), "--family", family, "--variant", variant],
            check=True,
            capture_output=True,
        )
        made[name] = out
    return made


def summary(times: list[float]) -> str:
    xs = sorted(times)
    return f"median {statistics.median(xs) * 1000:6.1f} ms  p90 {xs[int(0.9 * (len(xs) - 1))] * 1000:6.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=int, default=60)
    parser.add_argument("--seconds", type=int, default=12)
    parser.add_argument("--connections", type=int, default=32)
    ns = parser.parse_args()
    print(f"load: {Path('/proc/loadavg').read_text().split()[:3]} (1/5/15 min)")
    with tempfile.TemporaryDirectory() as tmp:
        made = fixtures(Path(tmp))
        models = Path(tmp) / "models.yaml"
        models.write_text(
            "models:\n  - {artifact: all-MiniLM-L6-v2, name: minilm}\n"
            + "".join(f"  - {{artifact: {path}}}\n" for path in made.values())
        )
        # a bundle of 4 holds 4 of a model's --max-queue places: room for every connection's tasks;
        # profile max_speed (merged rows, shared context) as served before profiles: the tiny fixtures
        # probe approximate, and under exact their rows would each run alone (docs/profiles.md)
        flags = ("--result-cache-entries", "0", "--max-queue", "1024", "--profile", "max_speed")
        with server("--models", str(models), *flags) as base:
            for name, make, prefixes in (
                ("router (4 models)", router_calls, ["", "", "", ""]),
                ("same model (4 embeddings)", same_model_calls, ["", "please ", "about: ", "upper "]),
            ):
                asyncio.run(lone_sets(base, make, 5))  # warm-up
                lone = asyncio.run(lone_sets(base, make, ns.sets))
                calls_lua = lua_calls(make("x"), prefixes)
                four = sets_per_second(base, calls_lua, "calls", ns.seconds, ns.connections)
                one = sets_per_second(base, calls_lua, "bundle", ns.seconds, ns.connections)
                print(f"\n{name}: a lone set of 4 tasks")
                for kind, times in lone.items():
                    print(f"  {kind:<11} {summary(times)}")
                seq, conc, bun = (statistics.median(lone[k]) for k in ("sequential", "concurrent", "bundle"))
                print(f"  bundle / sequential {bun / seq:.2f}, bundle / concurrent {bun / conc:.2f} (median latency)")
                print(
                    f"  under load ({ns.connections} connections, wrk): 4 calls {four:.1f} sets/s, bundle {one:.1f} sets/s,"
                )
                print(f"  bundle / calls {one / four:.2f} (throughput)")
    print(f"\nload after: {Path('/proc/loadavg').read_text().split()[:3]}")


if __name__ == "__main__":
    main()
