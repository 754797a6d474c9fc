"""A GGUF file's tensors (name, type, shape, data), read past its metadata without decoding it;
and the few metadata values a caller names, read the same way.

Why: `gguf.GGUFReader` decodes every metadata value into numpy arrays, several small arrays per
string: for SmolLM2's vocabulary (49,152 tokens and 48,900 merges) that took 3 to 4 s of a
start on 2 cores, for values the weight loader never reads (srt reads a GGUF model's config and
tokenizer from the Hugging Face files beside it, or writes them out once from the metadata).
Here the metadata is skipped by its lengths alone (tens of milliseconds), but for the values
asked for (`read_metadata`: what transformers' config mapping leaves out), and the tensor infos
are read as GGUFReader reads them: each tensor's data the same numpy view of the mapped file.

Little-endian files of GGUF versions 2 and 3 (what llama.cpp writes); any other goes through
`GGUFReader`, which reads them or says why not.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.quants import quant_shape_to_byte_shape

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32
_ALIGNMENT_KEY = b"general.alignment"
# The struct format of each fixed-size metadata value type.
_VALUE_FORMATS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_VALUE_BYTES = {kind: struct.calcsize(fmt) for kind, fmt in _VALUE_FORMATS.items()}
# The tensor of Llama 3's rope scaling in llama.cpp's files: one divisor per rotation frequency,
# part of the model's config (`ModelConfig.load`), not a weight.
ROPE_FREQS = "rope_freqs.weight"
# Tensor types whose data GGUFReader gives as numbers; every other type as bytes, per row.
_ELEMENT_DTYPES = {
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF's order: the fastest-varying dimension first
    data: np.ndarray  # read-only view of the file, as GGUFReader's `ReaderTensor.data`


def read_tensors(path: Path | str) -> list[GGUFTensor]:
    """Every tensor of GGUF file `path`, in the file's order (ValueError where the file is not
    a whole GGUF file)."""
    mapped = _mapped(path)
    if mapped is None:
        return [
            GGUFTensor(t.name, t.tensor_type, tuple(t.shape.tolist()), t.data)
            for t in GGUFReader(path).tensors
        ]
    try:
        tensors = _tensors(mapped)
    except struct.error:
        raise ValueError(f"{path} ends inside its header") from None
    if len({t.name for t in tensors}) != len(tensors):
        raise ValueError(f"{path}: a tensor name appears twice")
    return tensors


def read_metadata(path: Path | str, keys: Collection[str]) -> dict[str, Any]:
    """The values of the metadata `keys` that GGUF file `path` holds (a key it lacks is left
    out): numbers and strings as Python's, an array as None. Read as `read_tensors` reads, past
    every other value without decoding it (ValueError where the file is not a whole GGUF
    file)."""
    mapped = _mapped(path)
    if mapped is None:
        fields = GGUFReader(path).fields
        return {
            key: None if fields[key].types[0] == GGUFValueType.ARRAY else fields[key].contents()
            for key in keys
            if key in fields
        }
    try:
        (count,) = struct.unpack_from("<Q", mapped, 16)
        _, values = _metadata(mapped, 24, count, {key.encode() for key in keys})
    except struct.error:
        raise ValueError(f"{path} ends inside its header") from None
    return {key.decode(): value for key, (_, value) in values.items()}


def _mapped(path: Path | str) -> mmap.mmap | None:
    """GGUF file `path` mapped read-only, or None where it is not a little-endian file of the
    versions read here (`GGUFReader` reads it, or says why not)."""
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    version = struct.unpack_from("<I", mapped, 4)[0] if len(mapped) >= 8 else 0
    return mapped if mapped[:4] == _MAGIC and version in _VERSIONS else None


def _tensors(mapped: mmap.mmap) -> list[GGUFTensor]:
    tensor_count, kv_count = struct.unpack_from("<QQ", mapped, 8)
    offset, values = _metadata(mapped, 24, kv_count, {_ALIGNMENT_KEY})
    alignment = _alignment(values.get(_ALIGNMENT_KEY))
    infos = []
    for _ in range(tensor_count):
        raw_name, offset = _string(mapped, offset)
        (dims,) = struct.unpack_from("<I", mapped, offset)
        shape = struct.unpack_from(f"<{dims}Q", mapped, offset + 4)
        kind, data_offset = struct.unpack_from("<IQ", mapped, offset + 4 + 8 * dims)
        offset += 4 + 8 * dims + 12
        infos.append((raw_name.decode(), kind, shape, data_offset))
    _refuse_unknown_types(infos)
    start = -(-offset // alignment) * alignment
    tensors = []
    for name, type_id, shape, data_offset in infos:
        kind = GGMLQuantizationType(type_id)
        dims = tuple(reversed(shape))
        dtype = _ELEMENT_DTYPES.get(kind)
        if dtype is None:
            dtype, dims = np.uint8, quant_shape_to_byte_shape(dims, kind)
        block_size, type_size = GGML_QUANT_SIZES[kind]
        nbytes = int(np.prod(shape)) * type_size // block_size
        if start + data_offset + nbytes > len(mapped):
            raise ValueError(f"the data of tensor {name} runs past the end of the file")
        count = nbytes // np.dtype(dtype).itemsize
        data = np.frombuffer(mapped, dtype, count, start + data_offset).reshape(dims)
        tensors.append(GGUFTensor(name, kind, shape, data))
    return tensors


def _refuse_unknown_types(infos: list[tuple[str, int, tuple[int, ...], int]]) -> None:
    """ValueError naming the tensor type ids the `gguf` package does not know (a type newer than
    it, whose block size it cannot give), and tensors of each."""
    known = {kind.value for kind in GGMLQuantizationType}
    unknown: dict[int, list[str]] = {}
    for name, type_id, _, _ in infos:
        if type_id not in known:
            unknown.setdefault(type_id, []).append(name)
    if unknown:
        raise ValueError(
            "tensor types unknown to the gguf package, which srt cannot serve: "
            + "; ".join(f"type {type_id} ({listed(names)})" for type_id, names in unknown.items())
        )


def listed(names: list[str], shown: int = 3) -> str:
    """The first `shown` of `names`, and how many more there are."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def _string(mapped: mmap.mmap, offset: int) -> tuple[bytes, int]:
    (length,) = struct.unpack_from("<Q", mapped, offset)
    return mapped[offset + 8 : offset + 8 + length], offset + 8 + length


def _metadata(
    mapped: mmap.mmap, offset: int, count: int, wanted: Collection[bytes]
) -> tuple[int, dict[bytes, tuple[GGUFValueType, Any]]]:
    """The offset past `count` metadata pairs from `offset`, and the type and value of each of
    the `wanted` keys among them (a number or a string; an array's value None)."""
    values: dict[bytes, tuple[GGUFValueType, Any]] = {}
    for _ in range(count):
        key, offset = _string(mapped, offset)
        kind = GGUFValueType(struct.unpack_from("<I", mapped, offset)[0])
        offset += 4
        if key in wanted:
            if kind == GGUFValueType.STRING:
                value: Any = _string(mapped, offset)[0].decode()
            elif kind in _VALUE_FORMATS:
                value = struct.unpack_from(_VALUE_FORMATS[kind], mapped, offset)[0]
            else:
                value = None
            values[key] = (kind, value)
        offset = _skip_value(mapped, offset, kind)
    return offset, values


def _alignment(found: tuple[GGUFValueType, Any] | None) -> int:
    """The data's alignment: the file's `general.alignment` (its type and value), if any."""
    if found is None:
        return _DEFAULT_ALIGNMENT
    kind, alignment = found
    if kind != GGUFValueType.UINT32:
        raise ValueError("GGUF's general.alignment is not a uint32")
    if alignment == 0 or alignment & (alignment - 1):
        raise ValueError(f"GGUF alignment {alignment} is not a power of two")
    return int(alignment)


def _skip_value(mapped: mmap.mmap, offset: int, kind: int) -> int:
    """The offset past one metadata value of type `kind` at `offset` (ValueError for a type
    GGUF does not have)."""
    size = _VALUE_BYTES.get(GGUFValueType(kind))
    if size is not None:
        return offset + size
    if kind == GGUFValueType.STRING:
        return offset + 8 + struct.unpack_from("<Q", mapped, offset)[0]
    item, count = struct.unpack_from("<IQ", mapped, offset)
    offset += 12
    size = _VALUE_BYTES.get(GGUFValueType(item))
    if size is not None:
        return offset + size * count
    if item == GGUFValueType.STRING:
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            offset += 8 + unpack(mapped, offset)[0]
        return offset
    for _ in range(count):
        offset = _skip_value(mapped, offset, item)
    return offset
