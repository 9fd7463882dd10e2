"""`domain/inputs/batch_jobs.py`: input lines parsed or refused, which lines a rerun skips, how much of
an output a crash left intact."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_srun.domain.inputs.batch_jobs import (
    BadLine,
    BatchRequest,
    NotAnOutput,
    OutputLine,
    ResumeLedger,
    answers_the_input,
    intact_prefix,
    output_custom_id,
    parse_line,
    read_output_line,
)

URLS = frozenset({"/v1/embeddings", "/v1/rerank"})


def _line(**fields: object) -> str:
    return json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}, **fields})


def test_a_good_line_is_a_request() -> None:
    assert parse_line(_line(), URLS) == BatchRequest("a", "/v1/embeddings", {"input": "x"})


@pytest.mark.parametrize(
    ("text", "custom_id", "code"),
    [
        ("{oops", None, "invalid_json"),
        ("[1, 2]", None, "invalid_line"),
        (_line(custom_id=7), None, "invalid_line"),
        (_line(custom_id=""), None, "invalid_line"),
        (_line(method="GET"), "a", "invalid_line"),
        (_line(url="/v1/chat/completions"), "a", "unknown_url"),
        (_line(url=None), "a", "unknown_url"),
        (_line(body=[1]), "a", "invalid_line"),
        (_line(extra=1), "a", "invalid_line"),
    ],
)
def test_a_bad_line_says_why(text: str, custom_id: str | None, code: str) -> None:
    bad = parse_line(text, URLS)
    assert isinstance(bad, BadLine) and (bad.custom_id, bad.code) == (custom_id, code) and bad.message


def test_repeated_ids_are_flagged_and_written_ones_skipped_by_occurrence() -> None:
    ledger = ResumeLedger(["a", "a", None])
    assert [ledger.see(i) for i in ["a", "b", "a", "a", None, None]] == [
        (True, False),
        (False, False),
        (True, True),
        (False, True),
        (True, False),
        (False, False),  # lines without an id are never repeats of one another
    ]


@given(st.lists(st.sampled_from(["a", "b", "c", None]), max_size=30), st.data())
def test_a_rerun_answers_exactly_the_lines_after_the_written_prefix(ids: list[str | None], data: st.DataObject) -> None:
    """Answers are written in input order, so an interrupted run wrote a prefix: a rerun skips
    exactly that prefix, whatever ids repeat."""
    cut = data.draw(st.integers(0, len(ids)))
    ledger = ResumeLedger(ids[:cut])
    done = [ledger.see(i)[0] for i in ids]
    assert done == [True] * cut + [False] * (len(ids) - cut)


def _out(custom_id: str | None) -> bytes:
    return json.dumps({"id": "batch_req_1", "custom_id": custom_id, "response": None, "error": None}).encode()


def test_whole_lines_are_kept_and_a_torn_tail_dropped() -> None:
    whole = _out("a") + b"\n" + _out(None) + b"\n"
    kept = intact_prefix(whole)
    assert (kept.keep_bytes, kept.custom_ids, kept.torn) == (len(whole), ["a", None], False)
    torn = intact_prefix(whole + _out("b")[:12])
    assert (torn.keep_bytes, torn.custom_ids, torn.torn) == (len(whole), ["a", None], True)
    assert intact_prefix(b"").custom_ids == []


def test_a_bad_line_before_the_last_is_not_our_file() -> None:
    with pytest.raises(NotAnOutput, match="line 1"):
        intact_prefix(b"hello\n" + _out("a") + b"\n")


@pytest.mark.parametrize(
    "line",
    [
        b'{"id":"x","custom_id":"a","response":null,"error":null}',
        b'{"custom_id": "a", "id": "x", "response": null, "error": null}',
    ],
)
def test_the_custom_id_of_an_output_line(line: bytes) -> None:
    assert output_custom_id(line) == "a"


def _answered(custom_id: str, status: int) -> bytes:
    body = b'{"error":{"code":"x","message":"y"}}'
    return (
        b'{"id":"batch_req_1","custom_id":"'
        + custom_id.encode()
        + b'","response":{"status_code":'
        + str(status).encode()
        + b',"request_id":"r","body":'
        + body
        + b'},"error":null}'
    )


@pytest.mark.parametrize(
    ("line", "status"),
    [
        (_answered("a", 200), 200),
        (_answered("a", 401), 401),
        (_out("a"), None),
        (b'{"id":"batch_req_1","custom_id":"a","response":null,"error":{"code":"c","message":"m"}}', None),
        (b'{"custom_id":"a","id":"x","response":{"status_code":503,"body":{}},"error":null}', 503),
    ],
)
def test_the_status_of_an_output_line(line: bytes, status: int | None) -> None:
    assert read_output_line(line) == OutputLine("a", status)


def test_answers_that_say_nothing_about_the_input() -> None:
    assert [answers_the_input(s) for s in (None, 200, 400, 404, 413, 422)] == [True] * 6
    assert [answers_the_input(s) for s in (401, 403, 408, 429, 499, 500, 502, 503, 504)] == [False] * 9


def test_a_rerun_asks_again_from_the_first_answer_that_says_nothing_about_its_input() -> None:
    good = _answered("a", 200) + b"\n" + _answered("b", 400) + b"\n"
    data = good + _answered("c", 401) + b"\n" + _answered("d", 200) + b"\n" + _answered("e", 401) + b"\n"
    kept = intact_prefix(data)
    assert (kept.keep_bytes, kept.custom_ids, kept.redone, kept.torn) == (len(good), ["a", "b"], 3, False)


@pytest.mark.parametrize(
    "data",
    [
        b'{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{"input":"x"}}\n',  # a request file
        b'{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{"input":"x"}}',  # ... without its newline
        _out("a") + b"\n" + b'{"custom_id":"b","method":"POST","url":"/v1/embeddings","body":{}}\n',
        b"some notes\n",
        b"notes without a newline",
    ],
)
def test_a_file_that_is_not_our_output_is_never_appended_to(data: bytes) -> None:
    with pytest.raises(NotAnOutput, match="not a batch output line"):
        intact_prefix(data)


@pytest.mark.parametrize("line", [b'{"id":"x","custom_id":"a","respo', b"[1]", b'{"custom_id": 3}', b"{}"])
def test_what_is_not_an_output_line(line: bytes) -> None:
    with pytest.raises(ValueError):
        output_custom_id(line)
