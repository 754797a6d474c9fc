"""benches/bench_serving.py: its workloads, its metrics and its CPU accounting, as pure functions
on a tiny tokenizer."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from bench_serving import arrival_gaps, parse_args
from serving_client import ProcessTreeCpu
from serving_datasets import (
    best_cache_hit_rate,
    draw_lengths,
    prompt_token_ids,
    random_requests,
    shared_prefix_requests,
    sharegpt_requests,
)
from serving_metrics import RequestResult, percentile, summarize
from transformers import AutoTokenizer, PreTrainedTokenizerBase


@pytest.fixture(scope="module")
def tokenizer(tiny_model_factory: Callable[[str], Path]) -> PreTrainedTokenizerBase:
    # The llama fixture adds BOS, so prompt lengths must count special tokens.
    return AutoTokenizer.from_pretrained(tiny_model_factory("llama"))


def test_draw_lengths_spans_the_range() -> None:
    lengths = draw_lengths(random.Random(0), 2000, 10, 0.5)
    assert set(lengths) == set(range(5, 11))
    assert draw_lengths(random.Random(0), 50, 7, 1.0) == [7] * 50
    assert min(draw_lengths(random.Random(0), 500, 3, 0.0)) == 1
    with pytest.raises(ValueError, match="range-ratio"):
        draw_lengths(random.Random(0), 1, 10, 1.5)
    with pytest.raises(ValueError, match="at least 1"):
        draw_lengths(random.Random(0), 1, 0, 0.5)


def test_random_requests(tokenizer: PreTrainedTokenizerBase) -> None:
    requests = random_requests(tokenizer, random.Random(1), 20, 48, 9, 0.5)
    special = set(tokenizer.all_special_ids)
    assert [r.output_len for r in requests] != [9] * 20
    for r in requests:
        assert 4 <= r.output_len <= 9
        ids = prompt_token_ids(tokenizer, r.prompt)
        assert r.prompt_len == len(ids)
        assert ids[0] == tokenizer.bos_token_id
        assert not special & set(tokenizer.encode(r.prompt, add_special_tokens=False))
        # The prompt text re-encodes close to the length drawn for it, within [24, 48].
        assert 20 <= r.prompt_len <= 52
    again = random_requests(tokenizer, random.Random(1), 20, 48, 9, 0.5)
    assert [r.prompt for r in again] == [r.prompt for r in requests]
    other = random_requests(tokenizer, random.Random(2), 20, 48, 9, 0.5)
    assert [r.prompt for r in other] != [r.prompt for r in requests]


def test_shared_prefix_requests(tokenizer: PreTrainedTokenizerBase) -> None:
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


def test_sharegpt_requests(tokenizer: PreTrainedTokenizerBase, tmp_path: Path) -> None:
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
