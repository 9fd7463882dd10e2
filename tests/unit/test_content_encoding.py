"""Compressed request bodies: zstd (what typesafe-sdk sends), gzip, deflate; bounded once inflated."""

from __future__ import annotations

import gzip
import zlib

import pytest

from vllm_srun.adapters.http.content_encoding import decode_body
from vllm_srun.domain.errors import InvalidRequest, RequestTooLarge

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


def test_bad_or_unknown_encodings_are_invalid_requests() -> None:
    with pytest.raises(InvalidRequest, match="not valid gzip"):
        decode_body(BODY, "gzip", 10_000)
    with pytest.raises(InvalidRequest, match="unsupported Content-Encoding"):
        decode_body(BODY, "br", 10_000)


def test_a_body_that_inflates_past_the_limit_is_too_large() -> None:
    with pytest.raises(RequestTooLarge):
        decode_body(gzip.compress(b"0" * 1_000_000), "gzip", 100_000)
