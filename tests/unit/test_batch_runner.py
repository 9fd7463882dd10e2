"""`app/batch.py` against a fake server (httpx's MockTransport): answers written in input order
whatever order they complete in, 429/503 retried after Retry-After, a line refused past its
retries stops the run with a resumable output, and the progress bar quiet off a terminal."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from vllm_srun.app.batch import BatchOptions, Summary, run_batch
from vllm_srun.app.batch_progress import ProgressBar, clock_text, progress_text, summary_text

URLS = frozenset({"/v1/embeddings"})
Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


def _input(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "in.jsonl"
    lines = [
        json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings", "body": {"input": str(i)}})
        for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(tmp_path: Path, n: int, handler: Handler, stream: io.StringIO, **options: int) -> tuple[Summary, list[dict]]:
    out = tmp_path / "out.jsonl"

    async def go() -> Summary:
        client = httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://fake")
        async with client:
            return await run_batch(client, _input(tmp_path, n), out, URLS, BatchOptions(**options), ProgressBar(stream))

    summary = asyncio.run(go())
    return summary, [json.loads(line) for line in out.read_text().splitlines()]


def _echo(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"echo": json.loads(request.content)["input"]})


def test_answers_are_written_in_input_order_whatever_order_they_complete_in(tmp_path: Path) -> None:
    last_seen = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        text = json.loads(request.content)["input"]
        if text == "0":
            await last_seen.wait()  # the first line completes last
        if text == "5":
            last_seen.set()
        return _echo(request)

    stream = io.StringIO()
    summary, lines = _run(tmp_path, 6, handler, stream, concurrency=6)
    assert [line["custom_id"] for line in lines] == [f"r{i}" for i in range(6)]
    assert [line["response"]["body"]["echo"] for line in lines] == [str(i) for i in range(6)]
    assert (summary.ok, summary.errors, summary.stopped) == (6, 0, None)
    assert stream.getvalue().count("\n") == 1 and "6 rows written" in stream.getvalue()  # no bar off a terminal


def test_429_and_503_are_retried_after_retry_after(tmp_path: Path) -> None:
    tries: dict[str, int] = {}

    async def handler(request: httpx.Request) -> httpx.Response:
        text = json.loads(request.content)["input"]
        tries[text] = tries.get(text, 0) + 1
        if tries[text] <= 2:
            return httpx.Response(429 if text == "0" else 503, headers={"retry-after": "0"}, json={"error": {}})
        return _echo(request)

    summary, lines = _run(tmp_path, 3, handler, io.StringIO())
    assert all(line["response"]["status_code"] == 200 for line in lines)
    assert summary.retries == 6 and tries == {"0": 3, "1": 3, "2": 3}


def test_an_error_answer_is_an_error_line_with_the_servers_body(tmp_path: Path) -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"code": "invalid_request", "message": "no"}})

    summary, lines = _run(tmp_path, 1, handler, io.StringIO())
    assert lines[0]["response"]["status_code"] == 400 and lines[0]["error"] is None
    assert lines[0]["response"]["body"]["error"]["code"] == "invalid_request" and summary.errors == 1


def test_a_line_refused_past_its_retries_stops_the_run_and_a_rerun_resumes(tmp_path: Path) -> None:
    async def down_at_2(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["input"] == "2":
            raise httpx.ConnectError("refused")
        return _echo(request)

    stream = io.StringIO()
    summary, lines = _run(tmp_path, 5, down_at_2, stream, concurrency=1, max_retries=1)
    assert summary.stopped is not None and "ConnectError" in summary.stopped and "rerun to resume" in stream.getvalue()
    assert [line["custom_id"] for line in lines] == ["r0", "r1"]

    async def up(request: httpx.Request) -> httpx.Response:
        return _echo(request)

    again, lines = _run(tmp_path, 5, up, io.StringIO())
    assert (again.skipped, again.ok, again.stopped) == (2, 3, None)
    assert [line["custom_id"] for line in lines] == [f"r{i}" for i in range(5)]


def test_a_multiline_or_non_json_body_stays_on_one_line(tmp_path: Path) -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        text = json.loads(request.content)["input"]
        if text == "0":
            return httpx.Response(502, text="<html>\nbad gateway\n</html>")
        return httpx.Response(200, content=b'{\n  "pretty": true\n}', headers={"content-type": "application/json"})

    _, lines = _run(tmp_path, 2, handler, io.StringIO())
    assert lines[0]["response"]["body"] == "<html>\nbad gateway\n</html>" and lines[1]["response"]["body"] == {
        "pretty": True
    }


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_on_a_terminal_shows_rate_and_eta() -> None:
    now = [0.0]
    stream = _Tty()
    bar = ProgressBar(stream, clock=lambda: now[0])
    bar.start(100, 20)
    now[0] = 2.0
    bar.update(40, 1)
    shown = stream.getvalue().split("\r")[-1]
    assert "60/100" in shown and "20.0 rows/s" in shown and "ETA 0:02" in shown and "1 error lines" in shown


def test_texts() -> None:
    assert clock_text(3725) == "1:02:05" and clock_text(65) == "1:05"
    assert "ETA --:--" in progress_text(0, 10, 0.0, 0) and "100%" in progress_text(10, 10, 5.0, 0)
    text = summary_text(Summary(total=5, ok=3, errors=1, skipped=1, seconds=2.0, stopped="x"))
    assert "4 rows written (3 ok, 1 error lines)" in text and "2.0 rows/s" in text and "stopped: x" in text
