"""The bytes of an `input_audio` item (R-API-1): its base64 `data`, decoded with the size checked
first (from the encoded length, before decoding). `MediaError` with one line: invalid base64,
empty, or more bytes than the limit. No PyAV here: this runs on the request path.
"""

from __future__ import annotations

import base64
import binascii

from vllm_srun.adapters.contracts.media import MediaError


def audio_data_bytes(data: str, max_bytes: int) -> bytes:
    payload = data.strip()
    if payload.startswith("data:"):
        raise MediaError("input_audio.data is plain base64, not a data: URL")
    if len(payload) // 4 * 3 > max_bytes + 2:
        raise MediaError(f"the audio is over the limit of {max_bytes} bytes")
    try:
        decoded = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("invalid base64 in input_audio.data") from None
    if not decoded:
        raise MediaError("the audio is empty (input_audio.data holds no bytes)")
    return decoded
