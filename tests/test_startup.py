"""What a start costs, said in the log (`srt.startup`), and the start's own shortcuts: layers made
without their random initialization when a checkpoint fills them, a CPU KV cache in (huge) pages
zeroed at first touch, but for the slots of one largest prefill, written at the start."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from bench_startup import gguf_memory, stages
from gguf import GGMLQuantizationType, GGUFWriter
from torch import nn

from srt.layers.linear import Linear, initializing, uninitialized
from srt.layers.vocab_embedding import VocabEmbedding
from srt.mem_cache.memory_pool import KVPool
from srt.startup import Stages, log_process_start
from srt.testing.gguf_kquants import quantize
from srt.testing.server_process import ServerProcess

STAGE_LINE = re.compile(r"\[\S+ \S+ ([\w-]+)\] INFO start-up: (.+?): ([0-9.]+) s")


def test_each_stage_is_logged_with_its_seconds(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="srt.startup"):
        timer = Stages()
        time.sleep(0.02)
        timer.done("first")
        timer.done("second", "a detail")
        log_process_start()
    first, second, started = (r.getMessage() for r in caplog.records)
    seconds = float(re.fullmatch(r"start-up: first: ([0-9.]+) s", first).group(1))  # type: ignore[union-attr]
    assert 0.02 <= seconds < 5
    assert re.fullmatch(r"start-up: second: 0\.0\d s \(a detail\)", second)
    assert started.startswith("start-up: launch and imports: ")


def test_the_process_age_is_the_time_since_the_process_began() -> None:
    """A child's age, as it reads it, within the time between its parent starting it and
    reading the answer (less a clock tick: Linux counts a start in ticks)."""
    started = time.monotonic()
    child = subprocess.run(
        [sys.executable, "-c", "from srt.startup import process_age; print(process_age())"],
        capture_output=True,
        text=True,
        check=True,
    )
    elapsed = time.monotonic() - started
    age = float(child.stdout)
    assert 0 < age <= elapsed + 0.02


def test_a_servers_log_says_what_each_stage_of_its_start_cost(
    tiny_server: ServerProcess,
) -> None:
    logged = {(proc, name) for proc, name, _ in STAGE_LINE.findall(tiny_server.output())}
    for proc in ("main", "scheduler", "detokenizer"):
        assert (proc, "launch and imports") in logged
    for name in ("model config", "model built", "weights read", "weights packed", "KV cache"):
        assert ("scheduler", name) in logged
    for name in ("stages started", "warm-up generation", "ready, since srt-serve started"):
        assert ("main", name) in logged


def test_the_startup_bench_reads_the_stages_from_the_log() -> None:
    log = (
        "[2026-12-03 12:01:02 scheduler] INFO start-up: weights read: 0.38 s\n"
        "[2026-12-03 12:01:03 scheduler] INFO start-up: kernel plans: 0.01 s (5 read; cache /c)\n"
        "[2026-12-03 12:01:03 scheduler-tp1] INFO start-up: KV cache: 1.50 s\n"
        "[2026-12-03 12:01:03 main] INFO weights: 93.7 MB (bfloat16, quantization gguf)\n"
    )
    assert stages(log) == {
        "scheduler: weights read": 0.38,
        "scheduler: kernel plans": 0.01,
        "scheduler-tp1: KV cache": 1.5,
    }


def test_the_startup_bench_reports_a_gguf_file_s_tensor_bytes_beside_the_weights(
    tmp_path: Path,
) -> None:
    # 4 MiB of float32 and 1024 rows of 4 Q4_K super-blocks (144 bytes each): 4.5625 MiB.
    writer = GGUFWriter(tmp_path / "m.gguf", "llama")
    writer.add_tensor("dense", np.ones((1024, 1024), np.float32))
    blocks = quantize(np.ones((1024, 1024), np.float32), GGMLQuantizationType.Q4_K)
    writer.add_tensor("blocks", blocks, raw_dtype=GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf_memory(tmp_path / "m.gguf", 9.125) == {
        "gguf_tensor_mb": 4.6,
        "weights_to_gguf": 2.0,
    }
    assert gguf_memory(tmp_path / "m.gguf", None) == {"gguf_tensor_mb": 4.6}


def test_layers_made_for_a_checkpoint_skip_the_random_initialization(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def initialized(*args: object, **kwargs: object) -> None:
        raise AssertionError("initialized")

    monkeypatch.setattr(nn.init, "kaiming_uniform_", initialized)
    monkeypatch.setattr(nn.init, "normal_", initialized)
    assert initializing()
    with uninitialized():
        assert not initializing()
        Linear(64, 32)
        VocabEmbedding(100, 32)
    assert initializing()
    with pytest.raises(AssertionError, match="initialized"):
        Linear(64, 32)
    with pytest.raises(AssertionError, match="initialized"):
        VocabEmbedding(100, 32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cpu_kv_cache_is_zeros_each_buffer_its_own(dtype: torch.dtype) -> None:
    pool = KVPool(1000, 2, 2, 32, dtype, torch.device("cpu"))
    buffers = pool.k_buffers + pool.v_buffers
    for buffer in buffers:
        assert buffer.shape == (1001, 2, 32)
        assert buffer.dtype == dtype
        assert buffer.is_contiguous()
        assert not buffer.any()
    buffers[0][5] = 1.0
    assert all(not b.any() for b in buffers[1:])
    assert int(buffers[0].count_nonzero()) == 64


def _mapping(address: int) -> dict[str, str]:
    """The kernel's fields (`Rss`, `VmFlags`, ...) for the mapping of this process that holds
    `address`."""
    fields: dict[str, str] | None = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            if fields is not None:
                return fields
            start, end = (int(part, 16) for part in line.split()[0].split("-"))
            fields = {"start": f"{start:x}"} if start <= address < end else None
        elif fields is not None:
            name, _, value = line.partition(":")
            fields[name] = value.strip()
    if fields is None:
        raise AssertionError(f"no mapping holds {address:#x}")
    return fields


def _resident_kib(buffers: list[torch.Tensor]) -> int:
    """KiB resident in the mappings that hold `buffers` (adjacent ones may share one)."""
    mappings = {m["start"]: m for m in (_mapping(b.data_ptr()) for b in buffers)}
    return sum(int(m["Rss"].removesuffix(" kB")) for m in mappings.values())


@pytest.mark.skipif(
    not Path("/sys/kernel/mm/transparent_hugepage/enabled").exists(),
    reason="the kernel has no transparent huge pages",
)
def test_a_cpu_kv_cache_asks_for_huge_pages() -> None:
    pool = KVPool(100_000, 2, 2, 64, torch.bfloat16, torch.device("cpu"))
    for buffer in pool.k_buffers + pool.v_buffers:
        assert "hg" in _mapping(buffer.data_ptr())["VmFlags"].split()


def test_a_cpu_kv_cache_writes_the_slots_it_is_asked_to_and_no_more() -> None:
    # 128 bytes a slot: 32 MiB a buffer, of which 16,384 slots are 2 MiB.
    pool = KVPool(1 << 18, 2, 2, 32, torch.bfloat16, torch.device("cpu"))
    buffers = pool.k_buffers + pool.v_buffers
    before = _resident_kib(buffers)
    pool.prefault(16384)
    # 2 MiB and a slot each, in pages of 4 KiB or 2 MiB (at most two more than needed).
    assert 4 * 2048 < _resident_kib(buffers) - before <= 4 * 3 * 2048
    assert not any(buffer.any() for buffer in buffers)
