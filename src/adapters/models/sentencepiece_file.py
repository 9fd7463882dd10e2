"""A SentencePiece model file (`*.model`, a serialized ModelProto) written as protobuf bytes by
hand, so the fixture tokenizers need neither `sentencepiece` nor `protobuf` at run time: the
fields transformers' SentencePiece tokenizer classes read (Unigram pieces with scores and types,
the special pieces' ids and strings, identity normalization with SentencePiece's whitespace rules)."""

from __future__ import annotations

import struct
from collections.abc import Sequence


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int32s are written as ten-byte two's complement
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _pb_int(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _pb_bytes(number: int, payload: bytes | str) -> bytes:
    data = payload.encode("utf-8") if isinstance(payload, str) else payload
    return _varint((number << 3) | 2) + _varint(len(data)) + data


def _pb_float(number: int, value: float) -> bytes:
    return _varint((number << 3) | 5) + struct.pack("<f", value)


def sentencepiece_model(
    pieces: Sequence[tuple[str, float, int]],
    *,
    unk: int,
    bos: int,
    eos: int,
    pad: int,
    names: tuple[str, str, str, str],
) -> bytes:
    """A serialized SentencePiece ModelProto: Unigram, PIECES as (piece, score, type) with types
    1 normal, 2 unknown, 3 control; no byte fallback; identity normalization with SentencePiece's
    usual whitespace handling (dummy `▁` prefix, extra spaces removed, spaces escaped to `▁`).
    NAMES: the unknown, begin, end and pad pieces' strings."""
    body = b"".join(
        _pb_bytes(1, _pb_bytes(1, piece) + _pb_float(2, score) + _pb_int(3, kind)) for piece, score, kind in pieces
    )
    unk_piece, bos_piece, eos_piece, pad_piece = names
    trainer = b"".join(
        [
            _pb_int(3, 1),  # model_type UNIGRAM
            _pb_int(4, len(pieces)),  # vocab_size
            _pb_int(35, 0),  # byte_fallback
            _pb_int(40, unk),
            _pb_int(41, bos),
            _pb_int(42, eos),
            _pb_int(43, pad),
            _pb_bytes(45, unk_piece),
            _pb_bytes(46, bos_piece),
            _pb_bytes(47, eos_piece),
            _pb_bytes(48, pad_piece),
        ]
    )
    normalizer = _pb_bytes(1, "identity") + _pb_int(3, 1) + _pb_int(4, 1) + _pb_int(5, 1)
    return body + _pb_bytes(2, trainer) + _pb_bytes(3, normalizer)
