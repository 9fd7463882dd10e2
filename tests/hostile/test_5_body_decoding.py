"""Issue 9, class 5: the front and the worker decoded bodies differently: gzip, zstd and deflate
bodies (the typesafe SDK sends zstd) were accepted by the worker but 400 "not JSON" at the
front, and a plain body labelled with an unknown encoding was 400 at the worker but 200 at the
front. Both now read bodies through one module: the same answer for every case."""

from __future__ import annotations

import gzip
import json
import zlib

import pytest

from tests.hostile.clients import Server, model_name, post

pytestmark = pytest.mark.slow
zstd = pytest.importorskip("backports.zstd")


def body(server: Server) -> bytes:
    return json.dumps(
        {"model": model_name(server, "embed"), "input": ["compressed " * 200], "options": {"overflow": "truncate"}}
    ).encode()


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [("gzip", gzip.compress), ("deflate", zlib.compress), ("zstd", zstd.compress), ("identity", bytes)],
)
def test_compressed_bodies_are_read_alike(target: Server, encoding: str, compress) -> None:  # type: ignore[no-untyped-def]
    answer = post(target, "/v1/embeddings", compress(body(target)), **{"content-encoding": encoding})
    assert answer.status_code == 200, answer.text[:300]
    assert len(answer.json()["data"]) == 1


@pytest.mark.parametrize(
    ("encoding", "make", "status", "words"),
    [
        ("br", lambda b: b, 400, "unsupported Content-Encoding"),
        ("gzip", lambda b: b, 400, "not valid gzip"),
        ("gzip", lambda b: gzip.compress(b)[:-12], 400, "truncated"),
        ("gzip", lambda b: gzip.compress(b"[" + b" " * 60_000_000 + b"]"), 413, "once decompressed"),
        ("zstd", lambda b: zstd.compress(b" " * 60_000_000), 413, "once decompressed"),
    ],
    ids=["unknown", "not-gzip", "truncated", "gzip-bomb", "zstd-bomb"],
)
def test_bad_encodings_are_refused_alike(target: Server, encoding: str, make, status: int, words: str) -> None:  # type: ignore[no-untyped-def]
    answer = post(target, "/v1/embeddings", make(body(target)), **{"content-encoding": encoding})
    assert answer.status_code == status, answer.text[:300]
    assert words in answer.json()["error"]["message"]
