"""A fake `vllm-srun` worker on loopback TCP: enough HTTP/1.1 (keep-alive, content-length) to
stand in for an attached runtime in front tests, with behaviour chosen per request.

POST bodies are JSON; the `input` field picks the behaviour:
- `"slow:S"`: answer after S seconds (a closed connection meanwhile counts as `cancelled`);
- `"die"`: close the connection without answering;
- `"fail"`: 500 `internal_error`;
- anything else: 200 `{"model", "input", "path", "worker"}` echoing what arrived;
- on `/v1/bundle`, one such echo per task, `{results: [{id, status: 200, <surface>: echo}]}`.
`stall = True` makes every POST wait forever (a stuck forward that still answers /health).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FakeWorker:
    name: str = "fake"
    model: str = "fake-model"
    card: dict[str, Any] = field(default_factory=dict)
    healthy: bool = True
    stall: bool = False
    received: list[dict[str, Any]] = field(default_factory=list)
    cancelled: int = 0
    port: int = 0
    host: str = "127.0.0.1"  # any loopback address (127.0.0.0/8): replicas found through DNS share a port
    uds: str | None = None  # listen on this Unix socket instead (an attached `unix://` runtime)
    _server: asyncio.AbstractServer | None = None

    async def start(self) -> FakeWorker:
        if self.uds is not None:
            self._server = await asyncio.start_unix_server(self._connection, self.uds)
            return self
        self._server = await asyncio.start_server(self._connection, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def endpoint(self) -> str:
        return f"unix://{self.uds}" if self.uds is not None else f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    def full_card(self) -> dict[str, Any]:
        card = {
            "id": self.model,
            "object": "model",
            "model_sha256": "abc",
            "revision": None,
            "family": "encoder",
            "surfaces": ["embeddings"],
            "dtype": "float32",
            "status": "ready",
            "ready": True,
            "engine_args": {
                "max_num_seqs": 8192,
                "max_num_seqs_source": "class",
                "max_num_batched_tokens": 65536,
                "max_num_batched_tokens_source": "class",
                "batch_window_ms": 2.0,
                "dtype": "auto",
                "enable_shared_context": None,
                "max_model_len": None,
            },
            "limits": {"max_input_tokens": 128},
        }
        card.update(self.card)
        return card

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode().split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = 0
                for line in lines[1:]:
                    key, _, value = line.partition(":")
                    if key.strip().lower() == "content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                answer = await self._answer(method, path, body, reader)
                if answer is None:
                    return  # close without answering
                status, payload = answer
                data = json.dumps(payload).encode()
                writer.write(
                    f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
                    f"server-timing: queue;dur=1.000, forward;dur=2.000, total;dur=3.500\r\n"
                    f"content-length: {len(data)}\r\n\r\n".encode()
                    + data
                )
                await writer.drain()
        finally:
            writer.close()

    async def _answer(
        self, method: str, path: str, body: bytes, reader: asyncio.StreamReader
    ) -> tuple[int, Any] | None:
        if method == "GET" and path == "/health":
            return (200, {"status": "ready"}) if self.healthy else (503, {"status": "loading", "models": {}})
        if method == "GET" and path == "/v1/models":
            return 200, {"object": "list", "data": [self.full_card()]}
        doc = json.loads(body)
        self.received.append({**doc, "_path": path})
        if path == "/v1/bundle":
            results = []
            for task in doc["tasks"]:
                surface = next(k for k in task if k != "id")
                inner = task[surface]
                echo = {"model": inner.get("model", self.model), "input": inner.get("input"), "worker": self.name}
                results.append({"id": task["id"], "status": 200, surface: echo})
            return 200, {"results": results}
        what = str(doc.get("input", ""))
        if self.stall:
            what = "slow:3600"
        if what.startswith("slow:"):
            waiting = asyncio.ensure_future(asyncio.sleep(float(what[5:])))
            closed = asyncio.ensure_future(reader.read(1))  # b"" when the client hangs up
            done, _ = await asyncio.wait({waiting, closed}, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            closed.cancel()
            if closed in done:
                self.cancelled += 1
                return None
        if what == "die":
            return None
        if what == "fail":
            return 500, {"error": {"code": "internal_error", "message": "injected"}}
        return 200, {"model": doc.get("model", self.model), "input": what, "path": path, "worker": self.name}
