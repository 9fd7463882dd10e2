"""Request bodies, read and decoded the same way by the worker and the front (R-API-9):
compressed bodies (zstd, what typesafe-sdk sends; gzip; deflate) bounded once inflated, and JSON
that nests too deep, holds integers beyond 64 bits or a lone surrogate refused with one line."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from typing import Any

import msgspec
import pytest

from vllm_srun.adapters.http.request_body import (
    BODY_TIMED_OUT,
    MAX_JSON_DEPTH,
    check_json_values,
    decode_document,
    decode_request,
    read_body,
)
from vllm_srun.adapters.http.request_body import decompress as decode_body
from vllm_srun.adapters.schemas.decisions import decisions_decoder
from vllm_srun.domain.errors import Cancelled, InvalidRequest, RequestTimeout, RequestTooLarge

BODY = b'{"state": "' + b"x" * 5000 + b'"}'


def test_plain_and_identity_bodies_pass_through() -> None:
    assert decode_body(BODY, None, 10_000) == BODY
    assert decode_body(BODY, "identity", 10_000) == BODY


def test_gzip_and_deflate() -> None:
    assert decode_body(gzip.compress(BODY), "gzip", 10_000) == BODY
    assert decode_body(zlib.compress(BODY), "deflate", 10_000) == BODY


def test_zstd() -> None:
    zstd = pytest.importorskip("backports.zstd")
    assert decode_body(zstd.compress(BODY), "zstd", 10_000) == BODY
    assert decode_body(gzip.compress(zstd.compress(BODY)), "zstd, gzip", 10_000) == BODY  # applied in order


def test_bad_truncated_or_unknown_encodings_are_invalid_requests() -> None:
    with pytest.raises(InvalidRequest, match="not valid gzip"):
        decode_body(BODY, "gzip", 10_000)
    with pytest.raises(InvalidRequest, match="truncated"):
        decode_body(gzip.compress(BODY)[:-20], "gzip", 10_000)
    with pytest.raises(InvalidRequest, match="unsupported Content-Encoding"):
        decode_body(BODY, "br", 10_000)


def test_a_body_that_inflates_past_the_limit_is_too_large() -> None:
    with pytest.raises(RequestTooLarge):
        decode_body(gzip.compress(b"0" * 1_000_000), "gzip", 100_000)


def nested(depth: int, leaf: str = "1") -> bytes:
    return ("[" * depth + leaf + "]" * depth).encode()


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 999, 1000, 100_000])
def test_nesting_is_limited_for_typed_and_untyped_bodies(depth: int) -> None:
    state = nested(depth - 1)  # the outer object is one level
    typed = b'{"state": ' + state + b', "questions": {"q": {"type": "noul"}}}'
    untyped = b'{"state": ' + state + b"}"
    if depth <= MAX_JSON_DEPTH:
        assert decode_request(decisions_decoder, typed, None, 1 << 20).state
        assert decode_document(untyped, None, 1 << 20)[0]["state"]
        return
    for run in (
        lambda: decode_request(decisions_decoder, typed, None, 1 << 20),
        lambda: decode_document(untyped, None, 1 << 20),
    ):
        with pytest.raises(InvalidRequest, match=f"deeper than {MAX_JSON_DEPTH} levels"):
            run()


def test_integers_beyond_64_bits_are_refused_anywhere() -> None:
    big = 2**64
    for doc in ({"a": big}, {"a": [1, {"b": -(2**63) - 1}]}):
        with pytest.raises(InvalidRequest, match="beyond 64 bits"):
            check_json_values(doc)
    check_json_values({"a": [2**64 - 1, -(2**63), True, 1.5, None, "x"]})
    body = b'{"state": {"n": 123456789012345678901234567890}, "questions": {"q": {"type": "noul"}}}'
    with pytest.raises(InvalidRequest, match=r"\$\.state\.n"):
        decode_request(decisions_decoder, body, None, 1 << 20)


@pytest.mark.parametrize("raw", [b'{"input": "\\ud800"}', b'{"input": "a \\udbff b"}', b'{"input": "\\udc00"}'])
def test_a_lone_surrogate_is_named(raw: bytes) -> None:
    with pytest.raises(InvalidRequest, match="lone UTF-16 surrogate"):
        decode_document(raw, None, 1 << 20)
    decode_document(b'{"input": "\\ud83d\\ude00 and \\\\ud800"}', None, 1 << 20)  # a pair; an escaped backslash


@pytest.mark.parametrize("raw", [b"", b"[1]", b'{"a":', b"\xff", b"null"])
def test_what_is_not_a_json_object_is_refused(raw: bytes) -> None:
    with pytest.raises(InvalidRequest):
        decode_document(raw, None, 1 << 20)


def test_a_compressed_body_is_decoded_and_returned_plain() -> None:
    doc, plain = decode_document(gzip.compress(b'{"input": "a"}'), "gzip", 1 << 20)
    assert doc == {"input": "a"} and plain == b'{"input": "a"}'


class Receive:
    def __init__(self, *messages: dict[str, Any]) -> None:
        self.messages = list(messages)

    async def __call__(self) -> dict[str, Any]:
        return self.messages.pop(0)


def chunk(body: bytes, more: bool = True) -> dict[str, Any]:
    return {"type": "http.request", "body": body, "more_body": more}


def test_read_body_limits_and_endings() -> None:
    scope: dict[str, Any] = {"headers": []}
    assert asyncio.run(read_body(scope, Receive(chunk(b"ab"), chunk(b"c", False)), 10)) == b"abc"
    with pytest.raises(RequestTooLarge):  # a Content-Length over the limit: nothing is read
        asyncio.run(read_body({"headers": [(b"content-length", b"11")]}, Receive(), 10))
    with pytest.raises(RequestTooLarge):  # no Content-Length: stops as the stream passes the limit
        asyncio.run(read_body(scope, Receive(chunk(b"x" * 8), chunk(b"x" * 8)), 10))
    with pytest.raises(Cancelled):
        asyncio.run(read_body(scope, Receive(chunk(b"a"), {"type": "http.disconnect"}), 10))
    with pytest.raises(RequestTimeout):  # the connection guard marked the scope: a timeout, not a client gone
        asyncio.run(read_body({"headers": [], BODY_TIMED_OUT: True}, Receive({"type": "http.disconnect"}), 10))


def test_the_walk_reads_structs_too() -> None:
    class Inner(msgspec.Struct):
        value: Any

    check_json_values(Inner([1, 2]))
    with pytest.raises(InvalidRequest):
        check_json_values(Inner({"x": 2**70}))
