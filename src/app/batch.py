"""`vllm-srun batch`'s runner (docs/batch.md): an input file of OpenAI batch lines through an
HTTP client, answers appended to the output file in input order.

The client is the same for both targets: an `httpx.AsyncClient` on a running server (`--url`),
or on the worker's own ASGI app in this process (`batch_cli.py`), so each line gets exactly the
answer the online route gives, decoding, admission and the error table included. A window of
CONCURRENCY lines is in flight (issued and not yet written), so the scheduler merges them into
forwards as it merges concurrent clients'. 429 and 503 are retried after their Retry-After, a
transport error after a backoff; a line still refused after MAX_RETRIES stops the run (exit 1),
and as the output is a prefix of the input's lines, a rerun resumes after it (`domain/inputs/batch_jobs`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import httpx
import msgspec

from vllm_srun.app.batch_progress import ProgressBar, Summary
from vllm_srun.domain.inputs.batch_jobs import (
    API_KEY_ENV,
    CONCURRENCY,
    MAX_RETRIES,
    STOPPING_STATUSES,
    BadLine,
    BatchRequest,
    NotAnOutput,
    ResumeLedger,
    duplicate,
    intact_prefix,
    parse_line,
)

RETRIED = (429, 503)  # overloaded, not ready or draining: the answer says when to ask again
BACKOFF_S = 0.5  # a transport error's first wait, doubled each time
MAX_WAIT_S = 30.0  # the longest wait between two tries
WAIT_REPORT_S = 10.0  # while waiting for a server to be ready, a line this often
_encode = msgspec.json.Encoder().encode


class BatchRefused(Exception):
    """The run cannot start (one line): an unreadable input, an output that is not ours, a
    server that never became ready."""


class BatchStopped(Exception):
    """A line could not be answered after every retry: the run stops; a rerun resumes."""


@dataclass(frozen=True)
class BatchOptions:
    concurrency: int = CONCURRENCY
    max_retries: int = MAX_RETRIES
    ready_timeout_s: float = 600.0


def read_intact(output: Path, say: Callable[[str], None] = lambda _line: None) -> list[str | None]:
    """The custom_ids OUTPUT already answers. A torn last line (a crash's) is cut off the file, and
    so are the lines from the first whose answer says nothing about its input (401, 429, 5xx…:
    `answers_the_input`) to the end: a rerun asks them again (SAY tells how many)."""
    if not output.exists():
        return []
    if not output.is_file():
        raise BatchRefused(f"{output}: OUTPUT is not a file")
    try:
        intact = intact_prefix(output.read_bytes())
    except NotAnOutput as exc:
        raise BatchRefused(f"{output}: {exc}") from None
    except OSError as exc:
        raise BatchRefused(f"{output}: {exc.strerror or exc}") from None
    if intact.torn or intact.redone:
        with output.open("r+b") as f:
            f.truncate(intact.keep_bytes)
    if intact.redone:
        say(
            f"batch: {intact.redone:,} lines of {output} from the first answer that says nothing about its input "
            "(401/403, 408, 429, 5xx) are asked again"
        )
    return intact.custom_ids


def count_lines(path: Path) -> int:
    """Non-blank lines of PATH (the progress bar's total)."""
    count = 0
    with path.open("rb") as f:
        for line in f:
            count += bool(line.strip())
    return count


def error_line(bad: BadLine) -> bytes:
    """OpenAI's line for a request that was sent nowhere: `response: null`, `error: {code, message}`."""
    head = b'{"id":' + _encode(_batch_id()) + b',"custom_id":' + _encode(bad.custom_id)
    return head + b',"response":null,"error":' + _encode({"code": bad.code, "message": bad.message}) + b"}\n"


def answer_line(custom_id: str, response: httpx.Response) -> bytes:
    """OpenAI's line for an answered request: `response: {status_code, request_id, body}` (the
    server's body as sent, errors too), `error: null`."""
    request_id = response.headers.get("x-request-id") or f"req_{uuid.uuid4().hex}"
    head = b'{"id":' + _encode(_batch_id()) + b',"custom_id":' + _encode(custom_id)
    status = b',"response":{"status_code":' + str(response.status_code).encode()
    status += b',"request_id":' + _encode(request_id) + b',"body":' + _json_body(response) + b'},"error":null}\n'
    return head + status


def _json_body(response: httpx.Response) -> bytes:
    """The body as one line of JSON: as sent when it is compact JSON (ours is), re-encoded when it
    spans lines, a JSON string when it is no JSON (a proxy's text page)."""
    raw = response.content
    if response.headers.get("content-type", "").startswith("application/json") and raw and b"\n" not in raw:
        return raw
    try:
        return _encode(msgspec.json.decode(raw))
    except msgspec.DecodeError:
        return _encode(raw.decode(errors="replace"))


def _batch_id() -> str:
    return f"batch_req_{uuid.uuid4().hex}"


def retry_after_s(response: httpx.Response, attempt: int) -> float:
    """How long to wait before asking again: the answer's Retry-After (seconds), else a backoff."""
    try:
        return min(max(float(response.headers.get("retry-after", "")), 0.0), MAX_WAIT_S)
    except ValueError:
        return backoff_s(attempt)


def backoff_s(attempt: int) -> float:
    return min(BACKOFF_S * 2**attempt, MAX_WAIT_S)


@dataclass
class _InOrder:
    """Answers written in input order as they complete; each write frees a window slot."""

    out: BinaryIO
    window: asyncio.Semaphore
    summary: Summary
    bar: ProgressBar
    next_seq: int = 0
    issued: int = 0
    ready: dict[int, tuple[bytes, bool]] = field(default_factory=dict)
    stopped: str | None = None

    def reserve(self) -> int:
        self.issued += 1
        return self.issued - 1

    def put(self, seq: int, line: bytes, ok: bool) -> None:
        if self.stopped is not None:
            return
        self.ready[seq] = (line, ok)
        wrote = False
        while self.next_seq in self.ready:
            line, ok = self.ready.pop(self.next_seq)
            self.out.write(line)
            self.next_seq += 1
            if ok:
                self.summary.ok += 1
            else:
                self.summary.errors += 1
            self.window.release()
            wrote = True
        if wrote:
            self.out.flush()  # a crash loses at most the lines not yet handed to the OS
            self.bar.update(self.summary.written, self.summary.errors)

    def stop(self, why: str) -> None:
        if self.stopped is None:
            self.stopped = why
            self.window.release()  # the issuing loop may wait for a slot: it wakes and sees this


async def answer(
    client: httpx.AsyncClient, request: BatchRequest, options: BatchOptions, summary: Summary
) -> tuple[bytes, bool]:
    """REQUEST's output line, retrying 429/503 and transport errors; BatchStopped past the retries."""
    body = _encode(request.body)
    headers = {"content-type": "application/json"}
    why = ""
    for attempt in range(options.max_retries + 1):
        if attempt:
            summary.retries += 1
        try:
            response = await client.post(request.url, content=body, headers=headers)
        except httpx.TransportError as exc:
            why, wait = f"{type(exc).__name__}: {exc}".rstrip(": "), backoff_s(attempt)
        else:
            if response.status_code in STOPPING_STATUSES:
                raise BatchStopped(
                    f"custom_id {request.custom_id!r}: HTTP {response.status_code} {response.text[:200]} "
                    f"(the server refuses the key: set {API_KEY_ENV} to a key it accepts; a rerun resumes here)"
                )
            if response.status_code not in RETRIED:
                return answer_line(request.custom_id, response), response.status_code < 300
            why, wait = f"HTTP {response.status_code} {response.text[:200]}", retry_after_s(response, attempt)
        if attempt < options.max_retries:
            await asyncio.sleep(wait)
    raise BatchStopped(f"custom_id {request.custom_id!r}: {why} after {options.max_retries} retries")


async def wait_ready(
    client: httpx.AsyncClient, timeout_s: float, say: Callable[[str], None] = lambda _line: None
) -> None:
    """Until GET /health answers 200; BatchRefused when a model failed to load or TIMEOUT_S pass.
    While it waits, SAY tells what for, after a second and then every WAIT_REPORT_S."""
    started = time.monotonic()
    deadline = started + timeout_s
    told = started + 1.0 - WAIT_REPORT_S
    why = ""
    while True:
        try:
            health = await client.get("/health")
        except httpx.TransportError as exc:
            why = f"{type(exc).__name__}: {exc}"
        else:
            if health.status_code == 200:
                return
            why = f"/health: {health.status_code} {health.text[:300]}"
            if health.status_code == 503 and _failed(health):
                raise BatchRefused(f"not serving: {why}")
        now = time.monotonic()
        if now > deadline:
            raise BatchRefused(f"not ready after {timeout_s:g} s (--wait): {why}")
        if now - told >= WAIT_REPORT_S:
            told = now
            say(
                f"batch: waiting for {client.base_url} to be ready ({now - started:.0f} of {timeout_s:g} s, --wait): {why}"
            )
        await asyncio.sleep(0.1)


def _failed(health: httpx.Response) -> bool:
    try:
        return health.json().get("status") in ("failed", "degraded")
    except (ValueError, AttributeError):
        return False


async def run_batch(
    client: httpx.AsyncClient,
    input_path: Path,
    output_path: Path,
    urls: Collection[str],
    options: BatchOptions,
    bar: ProgressBar,
) -> Summary:
    """Answer INPUT_PATH's lines (URLS: the routes served) into OUTPUT_PATH; see the module's doc."""
    summary = Summary()
    started = time.perf_counter()
    ledger = ResumeLedger(read_intact(output_path, bar.say))
    summary.total = count_lines(input_path)
    window = asyncio.Semaphore(options.concurrency)
    tasks: set[asyncio.Task[None]] = set()
    try:
        out_file = output_path.open("ab")
    except OSError as exc:
        raise BatchRefused(f"{output_path}: {exc.strerror or exc}") from None
    with out_file as out, input_path.open("rb") as lines:
        writer = _InOrder(out, window, summary, bar)
        bar.start(summary.total, ledger.written)

        async def settle(seq: int, request: BatchRequest) -> None:
            try:
                line, ok = await answer(client, request, options, summary)
            except BatchStopped as exc:
                writer.stop(str(exc))
                return
            writer.put(seq, line, ok)

        try:
            for raw in lines:
                if not raw.strip():
                    continue
                item = parse_line(raw, urls)
                done, repeated = ledger.see(item.custom_id)
                if done:
                    summary.skipped += 1
                    continue
                await window.acquire()
                if writer.stopped is not None:
                    break
                seq = writer.reserve()
                if repeated and item.custom_id is not None:
                    item = duplicate(item.custom_id)
                if isinstance(item, BadLine):
                    writer.put(seq, error_line(item), False)
                    continue
                task = asyncio.create_task(settle(seq, item))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks and writer.stopped is None:
                await asyncio.wait(set(tasks), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            summary.seconds = time.perf_counter() - started
            summary.stopped = writer.stopped
            bar.finish(summary)
    return summary
