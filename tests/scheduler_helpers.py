"""What the scheduler tests share: `ScriptedRunner`, a model runner that returns ids whose
next token is a fixed function of the last input token (so that each step's batch is known in
advance) and that checks the request-to-token rows the batches write; request builders; and
`run_to_completion`, which checks the KV invariant after every step."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from runner_helpers import make_runner

from srt.forward_mode import ForwardMode
from srt.io_struct import BatchTokenIDOut, FinishReason, ReqTimeStats, TokenizedGenerateReq
from srt.managers.schedule_batch import Req, ScheduleBatch
from srt.managers.scheduler import Scheduler
from srt.model_executor.resolve import resolve_device_defaults
from srt.model_executor.worker_batch import (
    GRAMMAR_COMPILING,
    GenerationBatchResult,
    GrammarStatus,
    JumpForward,
    ModelWorkerBatch,
    RequestSamplingSpec,
    RunnerLimits,
)
from srt.sampling_params import SamplingParams
from srt.server_args import ServerArgs

VOCAB = 64
EOS = 5


@dataclass
class Pass:
    kind: str
    rids_rows: list[int]
    new_tokens: list[int]  # per sequence


def scripted_next(token: int) -> int:
    return (token + 1) % VOCAB


@dataclass
class ScriptedRunner:
    """A model runner whose next token is `(last input token + 1) % VOCAB` (the smallest id not
    banned when that one is: EOS and stop ids before `min_new_tokens`), so that each step's batch
    is known in advance. It records every pass, keeps its own request-to-token table from the
    writes each batch carries, and checks at every pass that each sequence's row holds exactly
    the scheduler's KV slots for it, and that sampling state lives from admission to finish."""

    max_total_tokens: int = 256
    max_running_requests: int = 8
    context_length: int = 512
    passes: list[Pass] = field(default_factory=list)
    specs: dict[str, RequestSamplingSpec] = field(default_factory=dict)
    num_outputs: dict[str, int] = field(default_factory=dict)
    table: dict[int, dict[int, int]] = field(default_factory=dict)
    in_flight: dict[str, Req] = field(default_factory=dict)  # the requests of the batch
    # Each grammar's compile as a test sets it (unset: still compiling); no masks are applied.
    grammars: dict[tuple[str, str], GrammarStatus] = field(default_factory=dict)
    # The jumps a test scripts per request, made in order as the scheduler asks (cut to its
    # budget, refused past its rollback limit), and every ask: (rid, max_rollback, budget).
    jumps: dict[str, list[JumpForward]] = field(default_factory=dict)
    jump_asks: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def limits(self) -> RunnerLimits:
        return RunnerLimits(
            context_length=self.context_length,
            vocab_size=VOCAB,
            eos_token_ids=frozenset({EOS}),
            max_total_tokens=self.max_total_tokens,
            max_running_requests=self.max_running_requests,
        )

    def add_request(self, rid: str, spec: RequestSamplingSpec) -> None:
        assert rid not in self.specs, f"{rid} admitted twice"
        self.specs[rid] = spec
        self.num_outputs[rid] = 0

    def remove_request(self, rid: str) -> None:
        self.specs.pop(rid, None)
        self.num_outputs.pop(rid, None)

    def grammar_status(self, kind: str, text: str) -> GrammarStatus:
        return self.grammars.get((kind, text), GRAMMAR_COMPILING)

    def jump_forward(self, rid: str, max_rollback: int, budget: int) -> JumpForward | None:
        assert rid in self.specs, f"{rid} jumped without sampling state"
        self.jump_asks.append((rid, max_rollback, budget))
        planned = self.jumps.get(rid)
        if not planned or planned[0].rollback > max_rollback:
            return None
        made = planned.pop(0)
        made = JumpForward(made.rollback, made.ids[: budget + made.rollback])
        self.num_outputs[rid] += len(made.ids) - made.rollback
        return made

    def forward_batch_generation(self, batch: ModelWorkerBatch) -> GenerationBatchResult:
        kind = "extend" if batch.forward_mode is ForwardMode.EXTEND else "decode"
        self.passes.append(Pass(kind, batch.rows, batch.extend_lens))
        for row, start, slots in batch.row_writes:
            self.table.setdefault(row, {}).update(enumerate(slots, start))
        tokens, start = [], 0
        for row, seq_len, n in zip(batch.rows, batch.seq_lens, batch.extend_lens, strict=True):
            new_slots = batch.out_cache_loc[start : start + n]
            self.table.setdefault(row, {}).update(enumerate(new_slots, seq_len - n))
            tokens.append(batch.input_ids[start : start + n])
            start += n
        self.check_rows(batch)
        lens = batch.logit_lens or [1] * batch.batch_size
        result = GenerationBatchResult([], [], [], [], [])
        for i, rid in enumerate(batch.rids):
            spec = self.specs[rid]
            rows = tokens[i][-lens[i] :]
            # All mass on the scripted token: logprob 0 for it, -inf for any other.
            asked = batch.prompt_logprobs[i] if batch.prompt_logprobs else None
            pairs = []
            if asked is not None:
                given = rows[asked.first_row : asked.first_row + len(asked.target_ids)]
                pairs = list(zip(asked.target_ids, map(scripted_next, given), strict=True))
            result.input_token_logprobs.append([0.0 if t == s else -math.inf for t, s in pairs])
            result.input_top_logprobs.append(
                [((s, 0.0),) if spec.top_logprobs_num else () for _, s in pairs]
            )
            if batch.sample is not None and not batch.sample[i]:
                continue
            banned: frozenset[int] = frozenset()
            if self.num_outputs[rid] < spec.params.min_new_tokens:
                banned = spec.stop_token_ids
            nxt = scripted_next(rows[-1])
            if nxt in banned:
                nxt = min(set(range(VOCAB)) - banned)
            self.num_outputs[rid] += 1
            result.next_ids.append(nxt)
            result.logprobs.append(0.0)
            result.top_logprobs.append([(nxt, 0.0)] if spec.top_logprobs_num else [])
        return result

    def check_rows(self, batch: ModelWorkerBatch) -> None:
        """Each sequence's row maps its positions to the slots the scheduler holds for it."""
        for rid, row, seq_len in zip(batch.rids, batch.rows, batch.seq_lens, strict=True):
            req = self.in_flight[rid]
            assert req.row == row
            assert [self.table[row][p] for p in range(seq_len)] == list(req.kv_slots)


def scheduler_over(runner: ScriptedRunner, **overrides: Any) -> Scheduler:
    args = resolve_device_defaults(ServerArgs(**overrides), torch.device("cpu"))
    scheduler = Scheduler(args, runner, tokenizer_path=None)
    build = scheduler.worker_batch

    def worker_batch(batch: ScheduleBatch) -> ModelWorkerBatch:
        runner.in_flight = {req.rid: req for req in batch.reqs}
        return build(batch)

    scheduler.worker_batch = worker_batch  # type: ignore[method-assign]
    return scheduler


REQUEST_FIELDS = ("stream", "return_logprob", "top_logprobs_num", "logprob_start_len")


def request(rid: str, ids: Iterable[int], **params: Any) -> TokenizedGenerateReq:
    """A greedy request; `params` are sampling parameters and `REQUEST_FIELDS`."""
    fields = {name: params.pop(name) for name in REQUEST_FIELDS if name in params}
    params.setdefault("temperature", 0.0)
    return TokenizedGenerateReq(rid, tuple(ids), SamplingParams(**params), **fields)


@dataclass
class Finished:
    output_ids: list[int]
    reason: FinishReason
    cached_tokens: int
    times: ReqTimeStats | None = None


def run_to_completion(scheduler: Scheduler, max_steps: int = 10_000) -> dict[str, Finished]:
    """Steps until idle, checking the KV invariant after every step."""
    outputs: dict[str, list[int]] = {}
    finished: dict[str, Finished] = {}
    for _ in range(max_steps):
        if not scheduler.has_work():
            break
        out = scheduler.step()
        assert scheduler.check_invariants() == []
        collect(out, outputs, finished)
    else:
        raise AssertionError("the scheduler did not finish")
    assert scheduler.is_idle()
    assert scheduler.check_invariants() == []
    runner = scheduler.runner
    live = runner.specs if isinstance(runner, ScriptedRunner) else runner.sampling.states  # type: ignore[attr-defined]
    assert not live, f"sampling state outlived its requests: {sorted(live)}"
    return finished


def collect(
    out: BatchTokenIDOut | None, outputs: dict[str, list[int]], finished: dict[str, Finished]
) -> None:
    if out is None:
        return
    # Stage times come once, with the finished message, in the order the stages happen.
    times = {out.rids[stats.index]: stats for stats in out.time_stats}
    assert len(times) == len(out.time_stats)
    assert set(times) == {r for r, f in zip(out.rids, out.finished_reasons, strict=True) if f}
    for stats in times.values():
        reached = [t for t in (stats.queued, stats.scheduled, stats.first_token) if t]
        assert stats.queued > 0
        assert [*reached, stats.finished] == sorted([*reached, stats.finished])
    for rid, ids, reason, cached, settings in zip(
        out.rids, out.output_ids, out.finished_reasons, out.cached_tokens, out.settings, strict=True
    ):
        # A request's settings cross once, with its first message.
        assert (settings is not None) == (rid not in outputs), rid
        outputs.setdefault(rid, []).extend(ids)
        if reason is not None:
            finished[rid] = Finished(outputs[rid], reason, cached, times[rid])


def real_scheduler(model: Path, **overrides: Any) -> Scheduler:
    settings: dict[str, Any] = {"max_total_tokens": 2048, "max_running_requests": 16}
    settings.update(overrides)
    runner = make_runner(model, **settings)
    return Scheduler(runner.server_args, runner, str(model))


def shared_prefix_prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    systems = [[rng.randrange(3, 400) for _ in range(24)] for _ in range(3)]
    return [
        systems[i % 3] + [rng.randrange(3, 400) for _ in range(rng.randrange(1, 12))]
        for i in range(n)
    ]


def generate(scheduler: Scheduler, prompts: list[list[int]], **params: Any) -> dict[str, Finished]:
    params.setdefault("max_new_tokens", 12)
    params.setdefault("ignore_eos", True)
    for i, prompt in enumerate(prompts):
        scheduler.add_request(request(f"r{i}", prompt, **params))
    return run_to_completion(scheduler)
