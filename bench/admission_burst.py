"""A 512-client burst against one CPU worker, with and without admission control (R-ADM-1).

`wrk` (C, one thread, so the load generator leaves the worker its core) keeps 512 connections
busy for `--seconds` with varied short texts (1–20 words, each body unique) at a
`vllm-srun serve all-MiniLM-L6-v2` worker, twice in one run:
  - admission on, at the defaults (`--max-queue 64 --max-queued-tokens 65536`);
  - admission off in effect (both limits at 10^9), i.e. the worker before this change;
then an offline sorted-batch encode of the same kind of texts as the throughput reference.

Per run it prints the answers by status, the answered texts/s, the latency of the admitted
(200) requests as the worker measured it (Server-Timing `total`, p50/p99/max: receipt of the
body to the answer) and as wrk saw every answer (p50/p99), the Retry-After values of the
429s, and the worker's RSS before the burst, at its peak during it and 3 s after.

    python bench/admission_burst.py [--seconds 20] [--connections 512]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _load import embeddings_body, process, run_load
from embeddings_load import WORDS, make_texts, offline_ceiling

LUA = r"""
local words = {WORDS}
local counter = 0
local threads = {}
math.randomseed(os.time())

setup = function(thread) table.insert(threads, thread) end

init = function(args) statuses = {}; admitted = {}; retry = {} end

request = function()
  counter = counter + 1
  local t = {}
  for i = 1, math.random(1, 20) do t[i] = words[math.random(#words)] end
  local body = '{"input": "' .. table.concat(t, " ") .. " " .. counter .. '"}'
  return wrk.format("POST", "/v1/embeddings", {["Content-Type"] = "application/json"}, body)
end

response = function(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
  if status == 200 then
    local timing = headers["server-timing"] or headers["Server-Timing"] or ""
    local total = timing:match("total;dur=([%d%.]+)")
    if total then admitted[#admitted + 1] = tonumber(total) end
  elseif status == 429 then
    local after = headers["retry-after"] or headers["Retry-After"] or "?"
    retry[after] = (retry[after] or 0) + 1
  end
end

done = function(summary, latency, requests)
  local all, counts, after = {}, {}, {}
  for _, thread in ipairs(threads) do
    for k, v in pairs(thread:get("statuses")) do counts[tostring(k)] = (counts[tostring(k)] or 0) + v end
    for k, v in pairs(thread:get("retry")) do after[tostring(k)] = (after[tostring(k)] or 0) + v end
    for _, v in ipairs(thread:get("admitted")) do all[#all + 1] = v end
  end
  table.sort(all)
  local function pct(q) if #all == 0 then return -1 end return all[math.max(1, math.ceil(q * #all))] end
  local parts = {}
  for k, v in pairs(counts) do parts[#parts + 1] = '"' .. k .. '": ' .. v end
  local retries = {}
  for k, v in pairs(after) do retries[#retries + 1] = '"' .. k .. '": ' .. v end
  io.write(string.format(
    'RESULT {"statuses": {%s}, "retry_after": {%s}, "admitted_p50_ms": %.1f, "admitted_p99_ms": %.1f, '
      .. '"admitted_max_ms": %.1f, "wrk_p50_ms": %.1f, "wrk_p99_ms": %.1f, "errors": %d, "seconds": %.2f}\n',
    table.concat(parts, ", "), table.concat(retries, ", "), pct(0.5), pct(0.99), pct(1.0),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.duration / 1e6))
end
"""


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def burst(base: str, pid: int, seconds: int, connections: int) -> dict[str, object]:
    run_load(base, [embeddings_body(t) for t in make_texts("short", 256, seed=1)], 16)  # warm-up
    time.sleep(1.0)
    before = rss_mib(pid)
    peak = [before]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_mib(pid))
            time.sleep(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    words = ", ".join(f'"{w}"' for w in WORDS)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(LUA.replace("{WORDS}", "{" + words + "}"))
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "60s", "-s", script.name, base],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    stop.set()
    sampler.join()
    time.sleep(3.0)
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    result: dict[str, object] = json.loads(line[len("RESULT ") :])
    result.update(rss_before_mib=before, rss_peak_mib=peak[0], rss_after_mib=rss_mib(pid))
    statuses = result["statuses"]
    assert isinstance(statuses, dict)
    result["texts_per_s"] = statuses.get("200", 0) / float(result["seconds"])  # type: ignore[arg-type]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--connections", type=int, default=512)
    ns = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install -y wrk)")
    print(f"load: {Path('/proc/loadavg').read_text().split()[:3]} (1/5/15 min), {ns.connections} connections")
    runs = {
        "admission (defaults)": (),
        "no admission (limits 10^9)": ("--max-queue", "1000000000", "--max-queued-tokens", "1000000000"),
    }
    results = {}
    for name, flags in runs.items():
        with process("vllm_srun.app.cli", "all-MiniLM-L6-v2", "--result-cache-entries", "0", *flags) as (base, pid):
            results[name] = burst(base, pid, ns.seconds, ns.connections)
    offline = offline_ceiling(make_texts("short", 2048, seed=2))
    for name, r in results.items():
        print(f"\n{name}")
        print(f"  answers by status:      {r['statuses']}   (transport errors: {r['errors']})")
        print(f"  Retry-After of the 429s: {r['retry_after'] or '-'}")
        print(
            f"  answered texts/s:       {r['texts_per_s']:.0f}  ({r['texts_per_s'] / offline:.2f} of offline {offline:.0f})"
        )
        print(
            f"  admitted latency (worker, ms): p50 {r['admitted_p50_ms']:.0f}  p99 {r['admitted_p99_ms']:.0f}"
            f"  max {r['admitted_max_ms']:.0f};  every answer (wrk): p50 {r['wrk_p50_ms']:.0f}  p99 {r['wrk_p99_ms']:.0f}"
        )
        print(
            f"  worker RSS (MiB): before {r['rss_before_mib']:.0f}, peak {r['rss_peak_mib']:.0f},"
            f" 3 s after {r['rss_after_mib']:.0f}"
        )
    on, off = results.values()
    print(
        f"\nadmitted p99 with admission / without: {float(on['admitted_p99_ms']) / float(off['admitted_p99_ms']):.3f};"  # type: ignore[arg-type]
        f" throughput ratio {float(on['texts_per_s']) / float(off['texts_per_s']):.2f}"  # type: ignore[arg-type]
    )


if __name__ == "__main__":
    main()
