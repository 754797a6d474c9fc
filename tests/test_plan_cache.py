"""Kernel plans kept on disk between starts (`srt.kernels.cpu.plan_cache`): a start that reads them
plans and generates as the start that measured them; a change of machine or shape measures
afresh; a file that holds no valid plan is ignored; concurrent writers never leave a torn file."""

from __future__ import annotations

import functools
import json
import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from runner_helpers import greedy_generate, make_runner
from test_quantized_loading import gguf_name, llama_cpp_permute
from transformers import AutoConfig

from srt.kernels.cpu import cpu_kernels, plan_cache, quant_kernels
from srt.kernels.cpu.quant_kernels import DENSE, KERNEL, Plan, QuantizedWeight
from srt.model_executor.weight_loader import iterate_weights

PROMPTS = [[5, 17, 42, 99, 7], [8, 9, 10]]


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache directory, and no plan of this process's kept in memory."""
    directory = tmp_path / "cache"
    monkeypatch.setenv("SRT_CACHE_DIR", str(directory))
    monkeypatch.delenv("SRT_DISABLE_KERNEL_PLAN_CACHE", raising=False)
    monkeypatch.setattr(quant_kernels, "_plans", {})
    return directory


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Measurements stand-in: the few-row kernel costs its rows, the dense path 100 rows'
    worth (a plan of ((0, KERNEL), (128, DENSE))); each probe's row count, in order."""
    seen: list[int] = []

    def probe(weight: QuantizedWeight, rows: int, *args: object) -> dict[str, float]:
        seen.append(rows)
        return {KERNEL: float(rows), DENSE: 100.0}

    monkeypatch.setattr(quant_kernels, "_probe", probe)
    return seen


MEASURED: Plan = ((0, KERNEL), (128, DENSE))
ONE_PLAN_OF_PROBES = len(quant_kernels._PROBE_ROWS)


def weight(rows: int = 64, columns: int = 64) -> QuantizedWeight:
    blocks = torch.randint(0, 256, (rows, columns // 32 * 20), dtype=torch.uint8)
    return QuantizedWeight(blocks, "q4_1", columns)


def plan_of(w: QuantizedWeight, dtype: torch.dtype = torch.float32) -> Plan:
    return quant_kernels._measure_plan(w, dtype, False)


def kept_files(cache_dir: Path) -> list[Path]:
    return sorted((cache_dir / plan_cache.DIRECTORY).iterdir())


@pytest.fixture
def tiny_gguf(tiny_model_factory: Callable[[str], Path], tmp_path: Path) -> Path:
    """The tiny llama as a GGUF file of Q4_1 blocks (norms in float32) beside its Hugging Face
    files, which srt reads its config and tokenizer from (`.srt-prepared`, as the default
    model's directory)."""
    source = tiny_model_factory("llama")
    directory = shutil.copytree(source, tmp_path / "tiny-gguf")
    (directory / ".srt-prepared").write_text("prepared from tiny.gguf\n")
    config = AutoConfig.from_pretrained(source)
    writer = GGUFWriter(directory / "tiny.gguf", "llama")
    for name, tensor in iterate_weights(str(source), None, config):
        assert isinstance(tensor, torch.Tensor)
        if name.endswith("q_proj.weight"):
            tensor = llama_cpp_permute(tensor, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            tensor = llama_cpp_permute(tensor, config.num_key_value_heads)
        values = tensor.numpy().astype(np.float32)
        if tensor.dim() == 2:
            kind = GGMLQuantizationType.Q4_1
            writer.add_tensor(gguf_name(name)[0], quantize(values, kind), raw_dtype=kind)
        else:
            writer.add_tensor(gguf_name(name)[0], values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return directory / "tiny.gguf"


def test_a_start_reads_the_plans_the_last_measured_and_generates_the_same_tokens(
    tiny_gguf: Path,
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="srt.startup"):
        first = make_runner(tiny_gguf, max_total_tokens=256)
    measured = dict(quant_kernels._plans)
    assert measured, "the runner plans its quantized products as it starts"
    assert len(kept_files(cache_dir)) == len(measured)
    lines = [r.getMessage() for r in caplog.records]
    assert f"{len(measured)} measured; cache {cache_dir / plan_cache.DIRECTORY})" in "\n".join(
        lines
    )
    tokens = greedy_generate(first, PROMPTS, 8, set())
    assert quant_kernels._plans == measured, "the warm-up-like generation measured nothing"

    caplog.clear()
    monkeypatch.setattr(quant_kernels, "_plans", {})

    def no_probe(*args: object) -> None:
        raise AssertionError("a plan kept on disk was measured again")

    monkeypatch.setattr(quant_kernels, "_probe", no_probe)
    with caplog.at_level(logging.INFO, logger="srt.startup"):
        second = make_runner(tiny_gguf, max_total_tokens=256)
    assert quant_kernels._plans == measured
    assert f"{len(measured)} read; cache" in "\n".join(r.getMessage() for r in caplog.records)
    assert greedy_generate(second, PROMPTS, 8, set()) == tokens


def test_a_plan_is_kept_per_machine_and_shape(
    cache_dir: Path, probes: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    square = weight()
    assert plan_of(square) == MEASURED
    assert len(probes) == ONE_PLAN_OF_PROBES
    assert plan_of(square) == MEASURED
    assert len(probes) == ONE_PLAN_OF_PROBES, "read, not measured"
    assert len(kept_files(cache_dir)) == 1

    changes: list[Callable[[], object]] = [
        lambda: plan_of(weight(96, 64)),  # another shape
        lambda: plan_of(square, torch.bfloat16),  # another dtype of activations
    ]
    fixed = plan_cache._fixed_machine_key()
    for key, value in (
        ("cpu_flags", fixed["cpu_flags"] + " newflag"),
        ("cpu", "another CPU"),
        ("torch_cpu", "capped"),
        ("onednn_isa", "AVX2"),
    ):
        changed = {**fixed, key: value}
        changes.append(functools.partial(_with_fixed_key, monkeypatch, changed, square))
    best = cpu_kernels.isa()[1]
    changes.append(lambda: _with_isa(monkeypatch, ("scalar", best), square))
    changes.append(lambda: _with_threads(monkeypatch, torch.get_num_threads() + 1, square))
    for change in changes:
        before = len(probes)
        change()
        assert len(probes) == before + ONE_PLAN_OF_PROBES, "a changed key measures again"
        change()
        assert len(probes) == before + ONE_PLAN_OF_PROBES, "and keeps what it measured"
    assert len(kept_files(cache_dir)) == 1 + len(changes)


def _with_fixed_key(
    monkeypatch: pytest.MonkeyPatch, key: dict[str, object], w: QuantizedWeight
) -> Plan:
    with monkeypatch.context() as m:
        m.setattr(plan_cache, "_fixed_machine_key", lambda: key)
        return plan_of(w)


def _with_isa(monkeypatch: pytest.MonkeyPatch, isa: tuple[str, str], w: QuantizedWeight) -> Plan:
    with monkeypatch.context() as m:
        m.setattr(cpu_kernels, "isa", lambda: isa)
        return plan_of(w)


def _with_threads(monkeypatch: pytest.MonkeyPatch, threads: int, w: QuantizedWeight) -> Plan:
    with monkeypatch.context() as m:
        m.setattr(torch, "get_num_threads", lambda: threads)
        return plan_of(w)


@pytest.mark.parametrize(
    "corrupt",
    [
        "not json {",
        "",
        '{"key": {"machine": {}, "plan": {}}, "plan": [[0, "_kernel"]]}',  # another key
        "plan: [[0, '_dense']]",
        None,  # the right key, a plan _plan_from cannot make: from (0, DENSE)
        "truncated",  # the right file cut in half
    ],
)
def test_a_file_that_holds_no_valid_plan_is_ignored_and_replaced(
    cache_dir: Path, probes: list[int], caplog: pytest.LogCaptureFixture, corrupt: str | None
) -> None:
    square = weight()
    plan_of(square)
    (path,) = kept_files(cache_dir)
    whole = path.read_text()
    if corrupt is None:
        kept = json.loads(whole)
        kept["plan"] = [[0, DENSE]]
        corrupt = json.dumps(kept)
    elif corrupt == "truncated":
        corrupt = whole[: len(whole) // 2]
    path.write_text(corrupt)
    with caplog.at_level(logging.WARNING, logger="srt.kernels.cpu.plan_cache"):
        assert plan_of(square) == MEASURED
    assert len(probes) == 2 * ONE_PLAN_OF_PROBES, "measured again"
    (record,) = caplog.records
    assert record.getMessage().startswith(f"kernel plan cache: ignoring {path}, which holds no")
    assert path.read_text() == whole, "replaced by the plan measured again"
    assert plan_of(square) == MEASURED
    assert len(probes) == 2 * ONE_PLAN_OF_PROBES


@pytest.mark.parametrize(
    ("kept", "offered"),
    [
        ([[0, KERNEL], [16, "_one_int8"], [64, DENSE]], True),
        ([[0, KERNEL], [8, DENSE], [32, KERNEL]], False),
    ],
)
def test_plans_as_made_parse_back(kept: list[list[object]], offered: bool) -> None:
    assert quant_kernels._parse_plan(kept, offered) == tuple(tuple(step) for step in kept)


@pytest.mark.parametrize(
    ("kept", "offered"),
    [
        ([], False),
        ([[4, KERNEL]], False),
        ([[0, KERNEL], [16, "_one_int8"]], False),  # the one-int8 kernel where it is not offered
        ([[0, KERNEL], [16, DENSE], [16, KERNEL]], False),  # rows not rising
        ([[0, KERNEL], [16, DENSE], [32, DENSE]], False),  # a path that does not change
        ([[0, KERNEL], [16, "_other"]], True),
        ([[0, KERNEL, 1]], False),
        ({"0": KERNEL}, False),
    ],
)
def test_what_is_no_plan_is_refused(kept: object, offered: bool) -> None:
    with pytest.raises((ValueError, TypeError)):
        quant_kernels._parse_plan(kept, offered)


def test_the_cache_off_measures_every_time_and_keeps_nothing(
    cache_dir: Path, probes: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SRT_DISABLE_KERNEL_PLAN_CACHE", "1")
    square = weight()
    plan_of(square)
    plan_of(square)
    assert len(probes) == 2 * ONE_PLAN_OF_PROBES
    assert not (cache_dir / plan_cache.DIRECTORY).exists()


def test_concurrent_writers_never_leave_a_torn_file(cache_dir: Path) -> None:
    """Processes starting together (tensor-parallel ranks, router replicas) measure the same
    shapes and write the same files: a reader sees a whole plan or none, never a partial one."""
    key = {"test": "concurrent"}
    plan = [[0, KERNEL], *([[rows, DENSE if rows % 2 else KERNEL] for rows in range(1, 1000)])]
    plan_cache.store(key, plan)
    stop = threading.Event()

    def write() -> None:
        while not stop.is_set():
            plan_cache.store(key, plan)

    writers = [threading.Thread(target=write) for _ in range(3)]
    for writer in writers:
        writer.start()
    try:
        seen = [plan_cache.load(key, lambda kept: kept) for _ in range(200)]
    finally:
        stop.set()
        for writer in writers:
            writer.join()
    assert all(found == plan for found in seen)
    (kept,) = kept_files(cache_dir)  # and no temporary file left behind
    assert kept.suffix == ".json"


def test_an_unwritable_cache_is_logged_and_measured_next_time(
    cache_dir: Path, probes: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    cache_dir.mkdir()
    (cache_dir / plan_cache.DIRECTORY).write_text("a file where the directory should be")
    square = weight()
    with caplog.at_level(logging.WARNING, logger="srt.kernels.cpu.plan_cache"):
        assert plan_of(square) == MEASURED
        assert plan_of(square) == MEASURED
    assert len(probes) == 2 * ONE_PLAN_OF_PROBES
    assert all("kernel plan cache: cannot" in r.getMessage() for r in caplog.records)
