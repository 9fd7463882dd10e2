"""Drive HTTP load with `wrk` (C; it costs the server under test far less CPU than a Python client).

`media_bodies` writes `/v1/embeddings` bodies whose media stay valid but differ in every request:
each carries a few bytes the decoder never reads (a JPEG comment segment, an MP4 `free` box), and
the Lua script rewrites four base64 characters there from a per-thread counter, so the decode
cache (R-PERF-4) never answers a benchmark request from memory unless asked to.
`run_wrk` runs one load and returns requests/s, latency percentiles and errors.
"""

from __future__ import annotations

import base64
import json
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

LUA = r"""
local templates = {TEMPLATES}
local alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local threads = {}
local counter = 0
local bodies = {}

function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end

function init(args)
  counter = (tonumber(id) or 0) * 1000000  -- `id` is set by setup() in this thread's state
  for i, t in ipairs(templates) do
    local f = assert(io.open(t[1], "rb"))
    local body = f:read("*a")
    f:close()
    bodies[i] = {body:sub(1, t[2]), body:sub(t[2] + 5), body:sub(t[2] + 1, t[2] + 4)}
  end
end

local function quad(n)
  local s = ""
  for _ = 1, 4 do
    local k = n % 64
    s = s .. alphabet:sub(k + 1, k + 1)
    n = math.floor(n / 64)
  end
  return s
end

local mutate = {MUTATE}

request = function()
  counter = counter + 1
  local b = bodies[(counter % #bodies) + 1]
  local body = b[1] .. (mutate and quad(counter) or b[3]) .. b[2]
  return wrk.format("POST", "{PATH}", {["content-type"] = "application/json"}, body)
end

done = function(summary, latency, requests)
  local errors = summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout
  io.write(string.format("JSON {\"requests\": %d, \"seconds\": %f, \"errors\": %d, \"p50_ms\": %f, \"p90_ms\": %f, \"p99_ms\": %f}\n",
    summary.requests, summary.duration / 1e6, errors,
    latency:percentile(50) / 1000, latency:percentile(90) / 1000, latency:percentile(99) / 1000))
end
"""


@dataclass
class WrkResult:
    requests: int
    seconds: float
    errors: int
    p50_ms: float
    p90_ms: float
    p99_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds


def with_comment(jpeg: bytes) -> bytes:
    """The JPEG with a 12-byte comment segment right after its start marker (payload at byte 6)."""
    return jpeg[:2] + b"\xff\xfe\x00\x0e" + b"vllm-srun!!!" + jpeg[2:]


def with_free_box(mp4: bytes) -> tuple[bytes, int]:
    """The MP4 with a trailing `free` box, and a byte offset (a multiple of 3) inside its payload."""
    start = len(mp4) + 8
    offset = -(-start // 3) * 3
    return mp4 + struct.pack(">I", 8 + 12) + b"free" + bytes(12), offset


def media_body(kind: str, data: bytes, offset: int, folder: Path, name: str) -> tuple[str, int]:
    """Write one request body; return (its path, the 0-based index of its mutable base64 quad)."""
    mime = "image/jpeg" if kind == "image" else "video/mp4"
    key = "image_url" if kind == "image" else "video_url"
    encoded = base64.b64encode(data).decode()
    body = json.dumps({"input": [{"type": key, key: {"url": f"data:{mime};base64,{encoded}"}}]})
    position = body.index(encoded) + offset // 3 * 4
    path = folder / name
    path.write_text(body)
    return str(path), position


def text_body(folder: Path, text: str) -> tuple[str, int]:
    body = json.dumps({"input": [text + " AAAA"]})
    path = folder / "text.json"
    path.write_text(body)
    return str(path), body.index("AAAA")


def run_wrk(
    base: str,
    templates: list[tuple[str, int]],
    *,
    connections: int,
    seconds: float,
    threads: int = 1,
    mutate: bool = True,
    timeout_s: int = 30,
    path: str = "/v1/embeddings",
) -> WrkResult:
    """wrk against BASE + PATH, cycling over TEMPLATES (each its own media unless MUTATE is off)."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (Debian: apt-get install -y wrk)")
    table = "{" + ", ".join(f'{{"{p}", {i}}}' for p, i in templates) + "}"
    lua = LUA.replace("{TEMPLATES}", table).replace("{MUTATE}", "true" if mutate else "false").replace("{PATH}", path)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(lua)
    done = subprocess.run(
        [
            "wrk",
            f"-t{threads}",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            f"--timeout={timeout_s}s",
            "-s",
            f.name,
            base,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    Path(f.name).unlink()
    line = next(x for x in done.stdout.splitlines() if x.startswith("JSON "))
    return WrkResult(**json.loads(line[5:]))
