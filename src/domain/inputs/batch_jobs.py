"""Offline batch jobs' bookkeeping (`vllm-srun batch`, docs/batch.md), pure: what one input line
of OpenAI's batch format asks for (or why it is a bad line), which lines a rerun skips, and how
much of an output file a crash left intact.

Lines are answered in input order, so the lines an output holds are always a prefix of the
input lines a run processes; a rerun skips the k-th input line carrying a custom_id when the
output already holds at least k lines with it (`ResumeLedger`): exact for duplicated ids and
for bad lines without an id (keyed None) too.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

CUSTOM_ID_KEY = '"custom_id":'  # how an output line we wrote names its input (`output_custom_id`)
CONCURRENCY = 64  # lines in flight by default: `serve`'s --max-queue default, so none waits for a 429
MAX_RETRIES = 8  # tries again of a line answered 429/503 or not reached, by default
API_KEY_ENV = "VLLM_SRUN_API_KEY"  # `batch --url`: the key sent as `Authorization: Bearer`, when set
_DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class BatchRequest:
    """One good input line: POST BODY (a JSON object) to URL, answered under CUSTOM_ID."""

    custom_id: str
    url: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class BadLine:
    """An input line that is sent nowhere: its output line carries `error: {code, message}`."""

    custom_id: str | None
    code: str
    message: str


def parse_line(text: str | bytes, urls: Collection[str]) -> BatchRequest | BadLine:
    """What the input line TEXT asks for, given the URLS served (the worker's POST routes)."""
    try:
        line = json.loads(text)
    except ValueError as exc:
        return BadLine(None, "invalid_json", f"not a JSON line: {exc}")
    if not isinstance(line, dict):
        return BadLine(None, "invalid_line", "a line is a JSON object with custom_id, method, url and body")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return BadLine(None, "invalid_line", "custom_id: a non-empty string is required")
    unknown = sorted(set(line) - {"custom_id", "method", "url", "body"})
    if unknown:
        return BadLine(custom_id, "invalid_line", f"unknown field {unknown[0]!r} (custom_id, method, url, body)")
    if line.get("method") != "POST":
        return BadLine(custom_id, "invalid_line", f"method: only POST is supported, got {line.get('method')!r}")
    url = line.get("url")
    if not isinstance(url, str) or url not in urls:
        return BadLine(custom_id, "unknown_url", f"url {url!r} is not served here (served: {', '.join(sorted(urls))})")
    body = line.get("body")
    if not isinstance(body, dict):
        return BadLine(custom_id, "invalid_line", "body: a JSON object (the request's body) is required")
    return BatchRequest(custom_id, url, body)


def duplicate(custom_id: str) -> BadLine:
    """The output of an input line whose custom_id an earlier input line already used."""
    return BadLine(custom_id, "duplicate_custom_id", f"custom_id {custom_id!r} is used by an earlier line")


class ResumeLedger:
    """Which input lines a run still answers, from the custom_ids an earlier run's output holds
    (None for bad lines without one), and which ids the input repeats."""

    def __init__(self, written: Iterable[str | None] = ()) -> None:
        self._written = Counter(written)
        self._seen: Counter[str | None] = Counter()

    @property
    def written(self) -> int:
        return self._written.total()

    def see(self, custom_id: str | None) -> tuple[bool, bool]:
        """(done, repeated) for the next input line carrying CUSTOM_ID: DONE when the output
        already answers it (a rerun skips it), REPEATED when an earlier input line had its id."""
        self._seen[custom_id] += 1
        count = self._seen[custom_id]
        return count <= self._written[custom_id], custom_id is not None and count > 1


# answers that say nothing about their input line (a missing key, a refused key, a proxy's
# authentication, a timeout, a full server, a client that went away, a server error): a run that
# meets 401 or 403 stops (no other line would fare better), and a rerun asks such lines again
# instead of counting them as answered
NOT_ABOUT_THE_INPUT = frozenset({401, 403, 407, 408, 429, 499})
STOPPING_STATUSES = frozenset({401, 403, 407})
OUR_LINE_START = b'{"id"'  # how every output line begins (a torn one too)


def answers_the_input(status: int | None) -> bool:
    """Whether an output line's STATUS (None: a line sent nowhere, a bad input line) is an answer
    about its input line, kept by a rerun."""
    return status is None or (status < 500 and status not in NOT_ABOUT_THE_INPUT)


@dataclass(frozen=True, slots=True)
class OutputLine:
    """What a rerun reads of one output line: its custom_id and its answer's HTTP status (None:
    the line was sent nowhere, `response: null`)."""

    custom_id: str | None
    status: int | None


@dataclass(frozen=True, slots=True)
class Intact:
    """What of an output file a rerun keeps: its first KEEP_BYTES (whole lines), their custom_ids,
    whether a torn last line (a crash's) was dropped, and how many whole lines it asks again
    (REDONE: from the first line whose answer says nothing about its input, `answers_the_input`,
    to the end, so that what is kept stays a prefix of the input's lines)."""

    keep_bytes: int
    custom_ids: list[str | None]
    torn: bool
    redone: int = 0


class NotAnOutput(ValueError):
    """An output file with a line `batch` did not write (a request file, any other file): it is
    left alone."""


def intact_prefix(data: bytes) -> Intact:
    """The whole lines of an output file's DATA a rerun keeps (`Intact`); a last line without its
    newline is torn (dropped) when it begins as one of ours. Raises NotAnOutput (one line) for
    any other line that is not an output line."""
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" after the last newline
    if tail and not (tail.startswith(OUR_LINE_START) or OUR_LINE_START.startswith(tail)):
        raise NotAnOutput(f"line {len(lines) + 1} is not a batch output line; not appending to this file")
    ids: list[str | None] = []
    keep = 0
    redo_from: int | None = None
    for number, line in enumerate(lines, 1):
        try:
            read = read_output_line(line)
        except ValueError:
            raise NotAnOutput(f"line {number} is not a batch output line; not appending to this file") from None
        if redo_from is None and not answers_the_input(read.status):
            redo_from = number
        if redo_from is None:
            ids.append(read.custom_id)
            keep += len(line) + 1
    redone = 0 if redo_from is None else len(lines) - redo_from + 1
    return Intact(keep, ids, bool(tail), redone)


def output_custom_id(line: bytes) -> str | None:
    """The custom_id of one output line (ValueError when it is not one)."""
    return read_output_line(line).custom_id


def read_output_line(line: bytes) -> OutputLine:
    """One output line's custom_id and status (ValueError when it is not an output line). Lines we
    write start `{"id": ..., "custom_id": ..., "response": {"status_code": ...`, read without
    decoding the (large) answer behind them; a line written by another tool is decoded whole and
    must have OpenAI's output fields (`custom_id`, `response`, `error`) and no request `body`."""
    text = line.decode()
    at = text.find(CUSTOM_ID_KEY)
    if text.startswith('{"id":') and at > 0:
        start = at + len(CUSTOM_ID_KEY)
        while text[start : start + 1] in (" ", "\t"):
            start += 1
        value, end = _DECODER.raw_decode(text, start)
        if not text.rstrip().endswith("}"):
            raise ValueError("an unterminated line")
        rest = text[end:]
        if rest.startswith(_NOWHERE):
            status: int | None = None
        elif rest.startswith(_ANSWERED) and rest[len(_ANSWERED) : len(_ANSWERED) + 3].isdigit():
            status = int(rest[len(_ANSWERED) : len(_ANSWERED) + 3])
        else:
            return _whole_line(text)
    else:  # written by hand or by another tool: decode it whole
        return _whole_line(text)
    if value is not None and not isinstance(value, str):
        raise ValueError("custom_id is not a string")
    return OutputLine(value, status)


_NOWHERE = ',"response":null'
_ANSWERED = ',"response":{"status_code":'


def _whole_line(text: str) -> OutputLine:
    parsed = json.loads(text)
    if not isinstance(parsed, dict) or not {"custom_id", "response", "error"} <= parsed.keys() or "body" in parsed:
        raise ValueError("not an output line (custom_id, response, error)")
    value, response = parsed["custom_id"], parsed["response"]
    if value is not None and not isinstance(value, str):
        raise ValueError("custom_id is not a string")
    status = response.get("status_code") if isinstance(response, dict) else None
    if response is not None and not isinstance(status, int):
        raise ValueError("response.status_code is not an integer")
    return OutputLine(value, status)
