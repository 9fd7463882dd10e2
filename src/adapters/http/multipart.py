"""`multipart/form-data` request bodies (RFC 7578), as the `typesafe-sdk` client sends a System One
request with media assets: a first part named `request` holding the JSON body, whose `assets`
entries name the parts that hold their bytes (`{"type": "image", "part": "asset-0"}`), then one
part per asset with the raw bytes.

`as_json(body, content_type, limit)` turns such a body into the JSON body it stands for: each
asset's part becomes its `data_base64`, so the request is decoded, checked and answered exactly as
the same request sent as JSON (and the front forwards it to a worker as JSON). A 400 with one line
for: no boundary, a malformed part, a part without a name or named twice, no `request` part or one
that is not a JSON object, an asset naming a part that is not there, a part that no asset or more
than one asset names, more than `MAX_PARTS` parts.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import msgspec

from vllm_srun.domain.errors import InvalidRequest

MULTIPART = "multipart/form-data"
REQUEST_PART = "request"
MAX_PARTS = 257  # the request and 256 assets
MAX_HEADER_BYTES = 4096  # of one part's headers
_BOUNDARY = re.compile(r'boundary=(?:"([^"]{1,70})"|([^\s;,"]{1,70}))', re.IGNORECASE)
_NAME = re.compile(rb'(?:^|;)\s*name="([^"]*)"', re.IGNORECASE)
_json = msgspec.json.Decoder()


def is_multipart(content_type: str | None) -> bool:
    return content_type is not None and content_type.strip().lower().startswith(MULTIPART)


def parts(body: bytes, content_type: str) -> dict[str, bytes]:
    """The parts of a multipart/form-data BODY by name."""
    found = _BOUNDARY.search(content_type)
    if found is None:
        raise InvalidRequest("a multipart/form-data body needs a boundary in its Content-Type")
    delimiter = b"--" + (found.group(1) or found.group(2)).encode("latin-1")
    chunks = body.split(delimiter)
    if len(chunks) < 3 or not chunks[-1].startswith(b"--"):
        raise InvalidRequest("the multipart body does not end with its closing boundary")
    if len(chunks) - 2 > MAX_PARTS:
        raise InvalidRequest(f"the multipart body has {len(chunks) - 2} parts (at most {MAX_PARTS})")
    out: dict[str, bytes] = {}
    for chunk in chunks[1:-1]:
        if not chunk.startswith(b"\r\n") or not chunk.endswith(b"\r\n"):
            raise InvalidRequest("a part of the multipart body is not framed by CRLF")
        head, sep, content = chunk[2:-2].partition(b"\r\n\r\n")
        if not sep or len(head) > MAX_HEADER_BYTES:
            raise InvalidRequest("a part of the multipart body has no blank line after its headers")
        name = _part_name(head)
        if name in out:
            raise InvalidRequest(f"the multipart body has two parts named {name[:64]!r}")
        out[name] = content
    return out


def _part_name(head: bytes) -> str:
    for line in head.split(b"\r\n"):
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-disposition":
            found = _NAME.search(value)
            if found is not None:
                return found.group(1).decode("utf-8", "replace")
    raise InvalidRequest("a part of the multipart body has no Content-Disposition name")


def as_json(body: bytes, content_type: str) -> bytes:
    """BODY (multipart/form-data) as the JSON body it stands for (module doc)."""
    named = parts(body, content_type)
    raw = named.pop(REQUEST_PART, None)
    if raw is None:
        raise InvalidRequest(f"the multipart body has no part named {REQUEST_PART!r} holding the JSON request")
    try:
        doc = _json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        raise InvalidRequest(f"the multipart part {REQUEST_PART!r} is not valid JSON") from None
    if not isinstance(doc, dict):
        raise InvalidRequest(f"the multipart part {REQUEST_PART!r} must hold a JSON object")
    assets = doc.get("assets")
    claimed: set[str] = set()
    if isinstance(assets, dict):
        for key, asset in assets.items():
            if not isinstance(asset, dict) or not isinstance(asset.get("part"), str):
                continue
            part = asset["part"]
            if part not in named:
                raise InvalidRequest(f"assets.{str(key)[:64]!r} names part {part[:64]!r}, which the body does not hold")
            if part in claimed:
                raise InvalidRequest(f"part {part[:64]!r} is named by more than one asset")
            claimed.add(part)
            assets[key] = _with_data({k: v for k, v in asset.items() if k != "part"}, named[part])
    unclaimed = sorted(set(named) - claimed)
    if unclaimed:
        raise InvalidRequest(f"part {unclaimed[0][:64]!r} of the multipart body is named by no asset")
    return msgspec.json.encode(doc)


def _with_data(asset: dict[str, Any], data: bytes) -> dict[str, Any]:
    return {**asset, "data_base64": base64.b64encode(data).decode("ascii")}
