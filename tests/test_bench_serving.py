"""benches/bench_serving.py: its workloads, its metrics and its CPU accounting on a tiny
tokenizer, and whole runs against a real srt-serve on a tiny model."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bench_serving import arrival_gaps, parse_args
from serving_client import ProcessTreeCpu
from serving_datasets import (
    BenchTokenizer,
    best_cache_hit_rate,
    draw_lengths,
    prompt_token_ids,
    random_requests,
    shared_prefix_requests,
    sharegpt_requests,
)
from serving_metrics import RequestResult, percentile, summarize
from transformers import AutoTokenizer

from srt.testing.server_process import ServerProcess


@pytest.fixture(scope="module")
def tokenizer(tiny_model_factory: Callable[[str], Path]) -> BenchTokenizer:
    # The llama fixture adds BOS, so prompt lengths must count special tokens.
    return BenchTokenizer(tiny_model_factory("llama"))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tokenizer_counts_as_transformers_does(
    tiny_model_factory: Callable[[str], Path], arch: str
) -> None:
    path = tiny_model_factory(arch)
    ours, theirs = BenchTokenizer(path), AutoTokenizer.from_pretrained(path)
    for text in ("Hello, world!", "  spaces\n\nand lines", "emoji 🙂 and 漢字", "<|im_start|>x"):
        assert ours.encode(text, add_special_tokens=True) == theirs.encode(text)
    assert ours.special_ids == set(theirs.all_special_ids)
    assert len(ours.ordinary_ids()) == len(theirs) - len(ours.special_ids)
    with pytest.raises(ValueError, match=r"tokenizer\.json"):
        BenchTokenizer(path.parent)


def test_draw_lengths_spans_the_range() -> None:
    lengths = draw_lengths(random.Random(0), 2000, 10, 0.5)
    assert set(lengths) == set(range(5, 11))
    assert draw_lengths(random.Random(0), 50, 7, 1.0) == [7] * 50
    assert min(draw_lengths(random.Random(0), 500, 3, 0.0)) == 1
    with pytest.raises(ValueError, match="range-ratio"):
        draw_lengths(random.Random(0), 1, 10, 1.5)
    with pytest.raises(ValueError, match="at least 1"):
        draw_lengths(random.Random(0), 1, 0, 0.5)


def test_random_requests(tokenizer: BenchTokenizer) -> None:
    requests = random_requests(tokenizer, random.Random(1), 20, 48, 9, 0.5)
    bos = tokenizer.encode("", add_special_tokens=True)
    assert [r.output_len for r in requests] != [9] * 20
    for r in requests:
        assert 4 <= r.output_len <= 9
        ids = prompt_token_ids(tokenizer, r.prompt)
        assert r.prompt_len == len(ids)
        assert ids[: len(bos)] == bos
        assert not tokenizer.special_ids & set(tokenizer.encode(r.prompt, add_special_tokens=False))
        # The prompt text re-encodes close to the length drawn for it, within [24, 48].
        assert 20 <= r.prompt_len <= 52
    again = random_requests(tokenizer, random.Random(1), 20, 48, 9, 0.5)
    assert [r.prompt for r in again] == [r.prompt for r in requests]
    other = random_requests(tokenizer, random.Random(2), 20, 48, 9, 0.5)
    assert [r.prompt for r in other] != [r.prompt for r in requests]


def test_shared_prefix_requests(tokenizer: BenchTokenizer) -> None:
    requests = shared_prefix_requests(tokenizer, random.Random(3), 3, 4, 64, 8, 5)
    assert len(requests) == 12
    assert all(r.output_len == 5 for r in requests)
    systems = [r.prompt.split("\n\n")[0] for r in requests]
    for group in range(3):
        assert len(set(systems[group * 4 : group * 4 + 4])) == 1
    assert len(set(systems)) == 3
    assert len({r.prompt for r in requests}) == 12
    # Three of four prompts per group can reuse about 64 of their ~74 tokens.
    best = best_cache_hit_rate([prompt_token_ids(tokenizer, r.prompt) for r in requests])
    assert 0.55 < best < 0.75
    with pytest.raises(ValueError, match="--gsp-question-len"):
        shared_prefix_requests(tokenizer, random.Random(3), 3, 4, 64, 0, 5)


def test_best_cache_hit_rate() -> None:
    assert best_cache_hit_rate([]) == 0.0
    assert best_cache_hit_rate([[1, 2, 3], [4, 5]]) == 0.0
    # The second prompt shares [1, 2]; the third repeats the first but must compute its last.
    assert best_cache_hit_rate([[1, 2, 3], [1, 2, 4], [1, 2, 3]]) == 4 / 9
    # The best earlier match counts, wherever it is in sorted order.
    assert best_cache_hit_rate([[5, 6, 7, 8], [1], [9], [5, 6, 7, 0], [5, 6]]) == (3 + 1) / 12


def write_sharegpt(path: Path, items: object) -> Path:
    path.write_text(json.dumps(items))
    return path


def test_sharegpt_requests(tokenizer: BenchTokenizer, tmp_path: Path) -> None:
    question = "How do shared memory rings hand frames between two processes safely?"
    answer = "Each ring has one producer and one consumer, and frames are length-prefixed."
    items = [
        {"conversations": [{"from": "gpt", "value": "hello"}]},
        {"conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": "ok"}]},
        {
            "conversations": [
                {"from": "system", "value": "be brief"},
                {"from": "human", "value": question},
                {"from": "gpt", "value": answer},
                {"from": "human", "value": "and then?"},
            ]
        },
        "not a conversation",
    ]
    path = write_sharegpt(tmp_path / "sg.json", items)
    (request,) = sharegpt_requests(tokenizer, random.Random(0), path, 1)
    assert request.prompt == question
    assert request.prompt_len == len(prompt_token_ids(tokenizer, question))
    assert request.output_len == len(tokenizer.encode(answer, add_special_tokens=False))
    # "ok" is under 4 tokens, so one usable conversation is all there is.
    with pytest.raises(ValueError, match="1 usable conversations, fewer than --num-prompts 2"):
        sharegpt_requests(tokenizer, random.Random(0), path, 2)
    with pytest.raises(ValueError, match="no conversation"):
        sharegpt_requests(tokenizer, random.Random(0), write_sharegpt(path, items[:1]), 1)
    with pytest.raises(ValueError, match="JSON list"):
        sharegpt_requests(tokenizer, random.Random(0), write_sharegpt(path, {"a": 1}), 1)
    path.write_text("[{")
    with pytest.raises(ValueError, match="not JSON"):
        sharegpt_requests(tokenizer, random.Random(0), path, 1)
    with pytest.raises(ValueError, match="cannot read"):
        sharegpt_requests(tokenizer, random.Random(0), tmp_path / "missing.json", 1)


def test_percentile_matches_numpy() -> None:
    rng = random.Random(4)
    values = [rng.uniform(0, 10) for _ in range(37)]
    for q in (0, 50, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_summarize() -> None:
    fast = RequestResult(0, 3, 10, success=True, ttft=0.1, e2e=0.5, output_len=3)
    fast.chunk_times = [0.1, 0.3, 0.5]
    fast.cached_tokens = 4
    slow = RequestResult(1, 3, 30, success=True, ttft=0.2, e2e=1.2, output_len=2)
    slow.chunk_times = [0.2, 1.2]
    slow.cached_tokens = 0
    failed = RequestResult(2, 3, 50, error="HTTP 400: too long")
    summary = summarize([fast, slow, failed], duration=2.0)
    assert summary["completed"] == 2
    assert summary["failed"] == 1
    assert summary["errors"] == [{"request": 2, "error": "HTTP 400: too long"}]
    assert summary["total_input_tokens"] == 40
    assert summary["total_output_tokens"] == 5
    assert summary["output_len_mismatches"] == 1
    assert summary["request_throughput"] == 1.0
    assert summary["input_throughput"] == 20.0
    assert summary["output_throughput"] == 2.5
    assert summary["cache_hit_rate"] == 4 / 40
    assert summary["mean_ttft_ms"] == pytest.approx(150)
    assert summary["median_e2e_ms"] == pytest.approx(850)
    # TPOT: (0.5 - 0.1) / 2 and (1.2 - 0.2) / 1; ITL: 0.2, 0.2 and 1.0.
    assert summary["mean_tpot_ms"] == pytest.approx(600)
    assert summary["median_itl_ms"] == pytest.approx(200)
    assert summary["p99_itl_ms"] == pytest.approx(984)
    # A server that does not report cached tokens for every request has no hit rate.
    slow.cached_tokens = None
    assert summarize([fast, slow], duration=1.0)["cache_hit_rate"] is None
    nothing = summarize([failed], duration=1.0)
    assert nothing["mean_ttft_ms"] is None
    assert nothing["cache_hit_rate"] is None
    with pytest.raises(ValueError, match="duration"):
        summarize([fast], duration=0.0)


def test_arrival_gaps() -> None:
    assert arrival_gaps(random.Random(0), 5, float("inf")) == [0.0] * 5
    gaps = arrival_gaps(random.Random(0), 20000, 4.0)
    assert np.mean(gaps) == pytest.approx(0.25, rel=0.05)


def test_parse_args_refuses_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["--dataset-path", "x.json"],
        ["--dataset-name", "sharegpt"],
        ["--num-prompts", "0"],
        ["--request-rate", "0"],
        ["--max-concurrency", "0"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            parse_args(argv)
        assert exit_info.value.code == 2
    assert "--max-concurrency must be at least 1" in capsys.readouterr().err
    assert parse_args(["--base-url", "http://h:1/"]).base_url == "http://h:1"


BURN = (
    "import sys, time\n"
    "while time.process_time() < 0.5: pass\n"
    "print('burnt', flush=True)\n"
    "sys.stdin.read()\n"
)


# psutil reads CPU times in clock ticks (10 ms), hence the margin below the 0.5 s burnt.
def test_process_tree_cpu_counts_children_alive_and_ended() -> None:
    cpu = ProcessTreeCpu(os.getpid())
    cpu.start()
    child = subprocess.Popen(
        [sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdin is not None
    assert child.stdout.readline() == "burnt\n"
    assert cpu.seconds() >= 0.45
    child.stdin.close()
    child.wait()
    # Reaped, the child's time moves to this process's children times.
    assert cpu.seconds() >= 0.45
    with pytest.raises(ValueError, match="no such process"):
        ProcessTreeCpu(child.pid)


def run_bench(server_url: str, out: Path, *flags: str) -> tuple[int, dict[str, Any], str]:
    """Runs the benchmark as a user would; returns its exit status, its JSON and its stderr."""
    bench = Path(__file__).resolve().parents[1] / "benches" / "bench_serving.py"
    command = [sys.executable, str(bench), "--base-url", server_url, "--disable-tqdm"]
    done = subprocess.run(
        [*command, "--json", str(out), *flags], capture_output=True, text=True, timeout=300
    )
    results = json.loads(out.read_text()) if out.exists() else {}
    return done.returncode, results, done.stderr


@pytest.mark.slow
def test_bench_serving_against_srt(tiny_server: ServerProcess, tmp_path: Path) -> None:
    status, results, stderr = run_bench(
        tiny_server.url,
        tmp_path / "gsp.json",
        *("--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "2"),
        *("--gsp-prompts-per-group", "3", "--gsp-system-prompt-len", "48"),
        *("--gsp-question-len", "8", "--gsp-output-len", "5", "--max-concurrency", "2"),
        *("--server-pid", str(tiny_server.process.pid)),
    )
    assert status == 0, stderr
    assert results["is_result"]
    assert (results["completed"], results["failed"], results["errors"]) == (6, 0, [])
    assert results["total_output_tokens"] == 30
    assert results["output_len_mismatches"] == 0
    assert results["cache_flushed"] is True
    assert 0 <= results["cache_hit_rate"] <= 1
    assert 0.4 < results["best_cache_hit_rate"] <= 1
    assert results["server_cpu_s_per_1k_output_tokens"] > 0
    for metric in ("ttft", "tpot", "itl", "e2e"):
        assert results[f"p99_{metric}_ms"] >= results[f"median_{metric}_ms"] > 0

    # Prompts beyond the tiny model's context: every request fails, and the run says so.
    status, results, stderr = run_bench(
        tiny_server.url,
        tmp_path / "too-long.json",
        *("--num-prompts", "2", "--random-input-len", "2100", "--random-output-len", "4"),
        *("--random-range-ratio", "1", "--seed", "7"),
    )
    assert status == 1
    assert not results["is_result"]
    assert (results["completed"], results["failed"]) == (0, 2)
    assert all("context length" in e["error"] for e in results["errors"])
    assert results["seed"] == 7
    assert "2 of 2 requests failed: this run is not a result" in stderr
