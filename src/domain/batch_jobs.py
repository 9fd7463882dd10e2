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


@dataclass(frozen=True, slots=True)
class Intact:
    """What of an output file a rerun keeps: its first KEEP_BYTES (whole lines), their custom_ids,
    and whether a torn last line (a crash's) was dropped."""

    keep_bytes: int
    custom_ids: list[str | None]
    torn: bool


class NotAnOutput(ValueError):
    """An output file with a bad line before its last: not one `batch` wrote; it is left alone."""


def intact_prefix(data: bytes) -> Intact:
    """The whole lines of an output file's DATA; a last line without its newline, or that is no
    output line, is torn. Raises NotAnOutput (one line) for a bad line before the last."""
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" after the last newline
    torn = bool(tail)
    ids: list[str | None] = []
    keep = 0
    for number, line in enumerate(lines, 1):
        try:
            ids.append(output_custom_id(line))
        except ValueError:
            if number == len(lines) and not torn:
                return Intact(keep, ids, True)  # a complete last line that is not ours: torn too
            raise NotAnOutput(f"line {number} is not a batch output line; not appending to this file") from None
        keep += len(line) + 1
    return Intact(keep, ids, torn)


def output_custom_id(line: bytes) -> str | None:
    """The custom_id of one output line (ValueError when it is not one). Lines we write start
    `{"id": ..., "custom_id": ...`, read without decoding the (large) answer behind them."""
    text = line.decode()
    at = text.find(CUSTOM_ID_KEY)
    if text.startswith('{"id":') and at > 0:
        start = at + len(CUSTOM_ID_KEY)
        while text[start : start + 1] in (" ", "\t"):
            start += 1
        value, _ = _DECODER.raw_decode(text, start)
        if not text.rstrip().endswith("}"):
            raise ValueError("an unterminated line")
    else:  # written by hand or by another tool: decode it whole
        parsed = json.loads(text)
        if not isinstance(parsed, dict) or "custom_id" not in parsed:
            raise ValueError("no custom_id")
        value = parsed["custom_id"]
    if value is not None and not isinstance(value, str):
        raise ValueError("custom_id is not a string")
    return value
