"""Request bodies, read and decoded the same way by the worker and the front (R-API-9).

1. `read_body`: the bytes, at most `--max-request-bytes` (413 on a larger Content-Length before
   anything is read, or as soon as the stream passes the limit); a client that goes away is
   `Cancelled`, a body that did not arrive in time (the connection guard) `RequestTimeout`.
2. `decompress`: `Content-Encoding: zstd | gzip | deflate | identity` (a comma-separated list,
   applied in order). The `typesafe-sdk` client compresses bodies of 1 KiB and more with zstd
   when it can. The inflated body is held to the same limit, so a small compressed body cannot
   expand without bound (a "zip bomb" stops at limit + 1 bytes); a truncated stream or an
   unknown coding is a 400.
3. `multipart/form-data` (the `typesafe-sdk` client's System One request with media assets) is
   turned into the JSON body it stands for (`multipart.py`), then read as JSON.
4. JSON: a body that is not JSON, has a lone UTF-16 surrogate, nests deeper than
   `MAX_JSON_DEPTH` or holds an integer beyond 64 bits is a 400 with a one-line message, before
   anything else reads it (`check_json_values` walks the decoded value without recursion).

`decode_request` (the worker: a typed Struct) and `decode_document` (the front: a JSON object)
are the two entry points after `read_body`.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import msgspec

from vllm_srun.adapters.http.allowed_values import with_allowed_values
from vllm_srun.adapters.http.multipart import as_json, is_multipart
from vllm_srun.domain.errors import Cancelled, InvalidRequest, RequestTimeout, RequestTooLarge

MAX_JSON_DEPTH = 64  # objects and arrays inside one another, the outermost counting 1
INT_RANGE = (-(2**63), 2**64 - 1)  # what msgpack, msgspec's encoders and most clients can hold
BODY_TIMED_OUT = "srun_body_timed_out"  # set in the ASGI scope by the connection guard
T = TypeVar("T")
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
_LONE_SURROGATE = re.compile(
    rb"(?<!\\)(?:\\\\)*\\u(?:[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})|[dD][c-fC-F][0-9a-fA-F]{2})"
)
_untyped = msgspec.json.Decoder()


# ---- bytes -----------------------------------------------------------------------------------------
def header(scope: Mapping[str, Any], name: bytes) -> bytes | None:
    """The first value of a request header (NAME in lower case) in an ASGI scope."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


def content_encoding(scope: Mapping[str, Any]) -> str | None:
    value = header(scope, b"content-encoding")
    return None if value is None else value.decode("latin-1")


def content_type(scope: Mapping[str, Any]) -> str | None:
    value = header(scope, b"content-type")
    return None if value is None else value.decode("latin-1")


async def read_body(scope: Mapping[str, Any], receive: Receive, limit: int) -> bytes:
    """The request body, at most LIMIT bytes."""
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge("request body is larger than --max-request-bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if scope.get(BODY_TIMED_OUT):
                raise RequestTimeout("the request body did not arrive in time")
            raise Cancelled("the client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RequestTooLarge("request body is larger than --max-request-bytes")
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def inflated_size(size: int, encoding: str | None, limit: int) -> int:
    """How large a body of SIZE bytes may be once decoded: SIZE, or LIMIT when it is compressed
    (what decides whether its decoding leaves the event loop)."""
    if encoding is None or encoding.strip().lower() in ("", "identity"):
        return size
    return max(size, limit)


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """BODY as sent, decompressed per ENCODING, at most LIMIT bytes once inflated."""
    codings = [c.strip().lower() for c in (encoding or "").split(",") if c.strip()]
    for coding in reversed(codings):  # the last coding listed was applied last
        if coding == "identity":
            continue
        try:
            if coding == "zstd":
                inflater = _zstd_decompressor()
            elif coding in ("gzip", "x-gzip", "deflate"):
                inflater = zlib.decompressobj(wbits=15 if coding == "deflate" else 31)
            else:
                raise InvalidRequest(f"unsupported Content-Encoding {coding[:40]!r} (zstd, gzip, deflate or identity)")
            out = inflater.decompress(body, limit + 1)
        except InvalidRequest:
            raise
        except Exception as exc:  # zlib.error, zstd's ZstdError: the body is not what it claims to be
            raise InvalidRequest(f"the body is not valid {coding} data: {str(exc)[:200]}") from None
        if len(out) > limit:
            raise RequestTooLarge("request body is larger than --max-request-bytes once decompressed")
        if not inflater.eof:
            raise InvalidRequest(f"the body is not valid {coding} data: the stream is truncated")
        body = out
    return body


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


# ---- JSON ------------------------------------------------------------------------------------------
def decode_request(decoder: msgspec.json.Decoder[T], body: bytes, encoding: str | None, limit: int) -> T:
    """The worker's entry point: the body as the route's request Struct (a multipart body is made
    JSON before: `http/app.py`)."""
    if encoding is not None:
        body = decompress(body, encoding, limit)
    try:
        value = decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise invalid_json(exc, body, decoder.type) from None
    check_json_values(value)
    return value


def decode_document(
    body: bytes, encoding: str | None, limit: int, kind: str | None = None
) -> tuple[dict[str, Any], bytes]:
    """The front's entry point: the body as a JSON object, and the plain (inflated) JSON bytes
    (KIND: its Content-Type; a multipart body becomes the JSON it stands for)."""
    if encoding is not None:
        body = decompress(body, encoding, limit)
    if is_multipart(kind):
        assert kind is not None
        body = as_json(body, kind)
    try:
        doc = _untyped.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise invalid_json(exc, body) from None
    if not isinstance(doc, dict):
        raise InvalidRequest("the body must be a JSON object")
    check_json_values(doc)
    return doc, body


def invalid_json(exc: BaseException, body: bytes, target: Any = None) -> InvalidRequest:
    """A one-line 400 for a body msgspec refused (a refused enum value of TARGET, the decoded
    type, names the values it takes)."""
    if isinstance(exc, RecursionError):
        return InvalidRequest(f"the body nests objects and arrays deeper than {MAX_JSON_DEPTH} levels")
    first = (str(exc).splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, msgspec.ValidationError):
        return InvalidRequest((first if target is None else with_allowed_values(first[:300], target))[:600])
    lone = _LONE_SURROGATE.search(body)
    if lone is not None:
        escape = lone.group(0).lstrip(b"\\").decode("ascii")
        return InvalidRequest(
            f"the body is not valid JSON text: a string holds a lone UTF-16 surrogate (\\{escape}, "
            f"at byte {lone.end() - 6}), which is not a Unicode character"
        )
    return InvalidRequest(f"the body is not valid JSON: {first[:200]}")


def check_json_values(root: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """400 when ROOT (decoded JSON: builtins or msgspec Structs) nests deeper than MAX_DEPTH or
    holds an integer outside INT_RANGE. Iterative, so no depth can exhaust the stack."""
    low, high = INT_RANGE
    stack: list[tuple[Iterable[Any], int, tuple[object, ...]]] = []

    def push(value: Any, depth: int, path: tuple[object, ...]) -> None:
        if depth > max_depth:
            raise InvalidRequest(
                f"the body nests objects and arrays deeper than {max_depth} levels (at {_spell(path)})"
            )
        stack.append((value, depth, path))

    def visit(value: Any, depth: int, path: tuple[object, ...]) -> None:
        if isinstance(value, str | float | bool) or value is None:
            return
        if isinstance(value, int):
            if not low <= value <= high:
                raise InvalidRequest(f"{_spell(path)}: the integer is beyond 64 bits ({str(value)[:30]}…)")
        elif isinstance(value, dict | list | tuple | msgspec.Struct):
            push(value, depth + 1, path)

    visit(root, 0, ())
    while stack:
        container, depth, path = stack.pop()
        if isinstance(container, dict):
            for key, item in container.items():
                if not isinstance(item, str):
                    visit(item, depth, (*path, key))
        elif isinstance(container, msgspec.Struct):
            for name in container.__struct_fields__:
                item = getattr(container, name)
                if item is not None and not isinstance(item, str):
                    visit(item, depth, (*path, name))
        else:
            for index, item in enumerate(container):
                if not isinstance(item, str):
                    visit(item, depth, (*path, index))


def _spell(path: tuple[object, ...]) -> str:
    """A JSON path as msgspec writes it: `$.state[3].a`, keys cut short."""
    parts = ["$"] + [f"[{part}]" if isinstance(part, int) else f".{str(part)[:32]}" for part in path[:12]]
    if len(path) > 12:
        parts.append("…")
    return "".join(parts)
