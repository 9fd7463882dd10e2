"""`data:` URLs of image and video inputs (R-API-1): the only URLs read; nothing is ever fetched.

`data_url_bytes(url, kind, max_bytes)` → the decoded bytes, or `MediaError` with one line: another
scheme, no comma, not base64, invalid base64, a media type of another kind, empty, or more bytes
than the limit (checked from the encoded length before decoding).
"""

from __future__ import annotations

import base64
import binascii

from vllm_srun.adapters.contracts.media import MediaError
from vllm_srun.domain.errors import ECHO_LIMIT

ACCEPTED_TYPES = {"image": ("image/",), "video": ("video/", "image/gif")}
NEUTRAL_TYPES = ("", "application/octet-stream")


def data_url_bytes(url: str, kind: str, max_bytes: int) -> bytes:
    scheme, colon, rest = url.partition(":")
    if not colon or scheme.strip().lower() != "data":
        named = (
            f"a {_echo(scheme.strip().lower())}: URL" if colon and scheme.strip() and "/" not in scheme else "not a URL"
        )
        raise MediaError(f"only data: URLs are read ({named}); nothing is ever fetched")
    header, comma, payload = rest.partition(",")
    if not comma:
        raise MediaError("the data URL has no comma before its data")
    params = [p.strip().lower() for p in header.split(";")]
    if "base64" not in params[1:]:
        raise MediaError("the data URL is not base64 (data:<type>;base64,<data>)")
    mime = params[0]
    if mime not in NEUTRAL_TYPES and not mime.startswith(ACCEPTED_TYPES[kind]):
        raise MediaError(
            f"a data URL of type {_echo(mime)} where {'an image' if kind == 'image' else 'a video'} is expected"
        )
    payload = payload.strip()
    if len(payload) // 4 * 3 > max_bytes + 2:
        raise MediaError(f"the {kind} is over the limit of {max_bytes} bytes")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("invalid base64 in the data URL") from None
    if not data:
        raise MediaError("the data URL holds no data")
    return data


def _echo(text: str) -> str:
    """A client's text as a message repeats it: cut to `ECHO_LIMIT` characters (R-API-9)."""
    return text if len(text) <= ECHO_LIMIT else f"{text[:ECHO_LIMIT]}… ({len(text)} characters)"
