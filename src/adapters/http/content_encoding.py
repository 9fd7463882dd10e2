"""Compressed request bodies (`Content-Encoding: zstd | gzip | deflate`).

The official `typesafe-sdk` client compresses bodies of 1 KiB and more with zstd whenever zstd is
available to it (Python 3.14's `compression.zstd`, or `backports.zstd`), so a server that reads
only plain JSON would refuse its larger requests. A decompressed body is held to the same
`--max-request-bytes` as a plain one (a small compressed body cannot expand without bound).
"""

from __future__ import annotations

import zlib
from typing import Any

from vllm_srun.domain.errors import InvalidRequest, RequestTooLarge


def _zstd_decompressor() -> Any:
    try:
        from compression.zstd import ZstdDecompressor
    except ImportError:
        try:
            from backports.zstd import ZstdDecompressor
        except ImportError:
            raise InvalidRequest(
                "Content-Encoding zstd needs Python 3.14 or the backports.zstd package on the server"
            ) from None
    return ZstdDecompressor()


def decode_body(body: bytes, encoding: str | None, limit: int) -> bytes:
    """BODY as sent, decompressed per ENCODING (a comma-separated list, applied in order)."""
    codings = [c.strip().lower() for c in (encoding or "").split(",") if c.strip()]
    for coding in reversed(codings):  # the last coding listed was applied last
        if coding == "identity":
            continue
        try:
            if coding == "zstd":
                inflater = _zstd_decompressor()
                out = inflater.decompress(body, max_length=limit + 1)
            elif coding in ("gzip", "x-gzip", "deflate"):
                raw = zlib.decompressobj(wbits=31 if coding != "deflate" else 15)
                out = raw.decompress(body, limit + 1)
            else:
                raise InvalidRequest(f"unsupported Content-Encoding {coding!r} (zstd, gzip, deflate or identity)")
        except InvalidRequest:
            raise
        except Exception as exc:  # zlib.error, zstd's ZstdError: the body is not what it claims to be
            raise InvalidRequest(f"the body is not valid {coding} data: {exc}") from None
        if len(out) > limit:
            raise RequestTooLarge("request body is larger than --max-request-bytes once decompressed")
        body = out
    return body
