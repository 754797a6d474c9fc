"""The one codec of every cross-process message: a type tag, then the fields in order.

No pickle: each message class of `srt.io_struct.MESSAGE_TYPES` gets an encoder and a decoder
compiled once from its type annotations. Wire format (little endian):

- a frame starts with the message's tag (`u8`, its position in `MESSAGE_TYPES` plus one);
- `int` is `i64`, `float` is `f64`, `bool` is one byte, `str` is `u32` length + UTF-8;
- `X | None` is a presence byte, then `X` when present;
- `tuple[int, ...]` (token ids) is `u32` count + packed `int32`s; other `tuple[X, ...]` are
  `u32` count + each item; fixed tuples and nested records are their items in order.

Decoding checks every length against the frame and rejects trailing bytes: a bad frame raises
`CodecError`, never returns a half-read message.
"""

from __future__ import annotations

import dataclasses
import struct
import sys
import types
import typing
from array import array
from collections.abc import Callable
from typing import Any

from srt.io_struct import MESSAGE_TYPES, Message

Encode = Callable[[bytearray, Any], None]
Decode = Callable[[memoryview, int], tuple[Any, int]]

_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
_U32 = struct.Struct("<I")
_LITTLE = sys.byteorder == "little"


class CodecError(ValueError):
    """A frame that is not a valid encoding of a known message."""


def _enc_int(buf: bytearray, v: int) -> None:
    buf += _I64.pack(v)


def _dec_int(mv: memoryview, off: int) -> tuple[int, int]:
    return _I64.unpack_from(mv, off)[0], off + 8


def _enc_float(buf: bytearray, v: float) -> None:
    buf += _F64.pack(v)


def _dec_float(mv: memoryview, off: int) -> tuple[float, int]:
    return _F64.unpack_from(mv, off)[0], off + 8


def _enc_bool(buf: bytearray, v: bool) -> None:
    buf.append(1 if v else 0)


def _dec_bool(mv: memoryview, off: int) -> tuple[bool, int]:
    byte = mv[off]
    if byte > 1:
        raise CodecError(f"bool byte {byte} at offset {off}")
    return byte == 1, off + 1


def _enc_str(buf: bytearray, v: str) -> None:
    data = v.encode()
    buf += _U32.pack(len(data))
    buf += data


def _take(mv: memoryview, off: int, n: int) -> tuple[memoryview, int]:
    end = off + n
    if end > len(mv):
        raise CodecError(f"{n} bytes at offset {off} overrun the {len(mv)}-byte frame")
    return mv[off:end], end


def _dec_str(mv: memoryview, off: int) -> tuple[str, int]:
    (n,) = _U32.unpack_from(mv, off)
    data, off = _take(mv, off + 4, n)
    return str(data, "utf-8"), off


def _enc_ids(buf: bytearray, v: tuple[int, ...]) -> None:
    ids = array("i", v)
    if not _LITTLE:
        ids.byteswap()
    buf += _U32.pack(len(ids))
    buf += ids.tobytes()


def _dec_ids(mv: memoryview, off: int) -> tuple[tuple[int, ...], int]:
    (n,) = _U32.unpack_from(mv, off)
    data, off = _take(mv, off + 4, 4 * n)
    ids = array("i")
    ids.frombytes(data)
    if not _LITTLE:
        ids.byteswap()
    return tuple(ids), off


_SCALARS: dict[Any, tuple[Encode, Decode]] = {
    int: (_enc_int, _dec_int),
    float: (_enc_float, _dec_float),
    bool: (_enc_bool, _dec_bool),
    str: (_enc_str, _dec_str),
}


def _optional(enc: Encode, dec: Decode) -> tuple[Encode, Decode]:
    def encode(buf: bytearray, v: Any) -> None:
        if v is None:
            buf.append(0)
        else:
            buf.append(1)
            enc(buf, v)

    def decode(mv: memoryview, off: int) -> tuple[Any, int]:
        present, off = _dec_bool(mv, off)
        return dec(mv, off) if present else (None, off)

    return encode, decode


def _sequence(enc: Encode, dec: Decode) -> tuple[Encode, Decode]:
    def encode(buf: bytearray, v: tuple[Any, ...]) -> None:
        buf += _U32.pack(len(v))
        for item in v:
            enc(buf, item)

    def decode(mv: memoryview, off: int) -> tuple[tuple[Any, ...], int]:
        (n,) = _U32.unpack_from(mv, off)
        off += 4
        if n > len(mv) - off:  # every item takes at least one byte
            raise CodecError(f"{n} items at offset {off} overrun the {len(mv)}-byte frame")
        items = []
        for _ in range(n):
            item, off = dec(mv, off)
            items.append(item)
        return tuple(items), off

    return encode, decode


def _fields(parts: list[tuple[Encode, Decode]], make: Callable[..., Any]) -> tuple[Encode, Decode]:
    encoders = [enc for enc, _ in parts]
    decoders = [dec for _, dec in parts]

    def encode(buf: bytearray, v: Any) -> None:
        for enc, item in zip(encoders, v, strict=True):
            enc(buf, item)

    def decode(mv: memoryview, off: int) -> tuple[Any, int]:
        values = []
        for dec in decoders:
            value, off = dec(mv, off)
            values.append(value)
        return make(*values), off

    return encode, decode


def _record(cls: type) -> tuple[Encode, Decode]:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    encode, decode = _fields([_codec_for(hints[name]) for name in names], cls)

    def encode_record(buf: bytearray, v: Any) -> None:
        encode(buf, [getattr(v, name) for name in names])

    return encode_record, decode


def _codec_for(hint: Any) -> tuple[Encode, Decode]:
    """The encoder and decoder of one annotated type (see the module docstring)."""
    if hint in _SCALARS:
        return _SCALARS[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return _optional(*_codec_for(inner))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return (_enc_ids, _dec_ids) if args[0] is int else _sequence(*_codec_for(args[0]))
    if origin is tuple:
        return _fields([_codec_for(a) for a in args], lambda *items: tuple(items))
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _record(hint)
    raise TypeError(f"the codec cannot carry {hint!r}")


_ENCODERS: dict[type, tuple[int, Encode]] = {}
_DECODERS: list[Decode] = []
for _tag, _cls in enumerate(MESSAGE_TYPES, start=1):
    _enc, _dec = _record(_cls)
    _ENCODERS[_cls] = (_tag, _enc)
    _DECODERS.append(_dec)


def encode(msg: Message) -> bytes:
    """The frame of one message."""
    try:
        tag, enc = _ENCODERS[type(msg)]
    except KeyError:
        raise TypeError(f"{type(msg).__name__} is not a cross-process message") from None
    buf = bytearray((tag,))
    enc(buf, msg)
    return bytes(buf)


def message_type(frame: bytes) -> type:
    """The class of the message in `frame`, read from its tag alone (for forwarding)."""
    if not frame or not 1 <= frame[0] <= len(_DECODERS):
        raise CodecError(f"unknown message tag {frame[:1]!r}")
    return MESSAGE_TYPES[frame[0] - 1]


def decode(frame: bytes) -> Message:
    """The message in `frame`; raises `CodecError` unless the frame is exactly one message."""
    message_type(frame)
    mv = memoryview(frame)
    try:
        msg, end = _DECODERS[frame[0] - 1](mv, 1)
    except CodecError:
        raise
    except (struct.error, UnicodeDecodeError, ValueError, IndexError) as e:
        raise CodecError(f"malformed {MESSAGE_TYPES[frame[0] - 1].__name__} frame: {e}") from e
    if end != len(frame):
        raise CodecError(f"{len(frame) - end} trailing bytes after a {type(msg).__name__}")
    return typing.cast(Message, msg)
