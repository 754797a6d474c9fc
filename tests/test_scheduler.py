"""The scheduler's decisions, step by step, with the KV invariant checked after every step.

Scheduling decisions (batch composition, chunk sizes, policy order, retraction order) run over
`ScriptedRunner`, a model runner that returns ids, whose next token is a fixed function of the
last input token, so that each step's batch is known in advance; it checks the request-to-token
rows that the batches write. Outputs (continuous batching, cache reuse, retraction, chunking,
aborts) run over the real `ModelRunner` on a tiny model and are compared with each request run
alone.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from runner_helpers import make_runner

from srt.forward_mode import ForwardMode
from srt.io_struct import BatchTokenIDOut, DetokenizeSettings, FinishReason, TokenizedGenerateReq
from srt.managers.req_queue import ReqQueue
from srt.managers.schedule_batch import Req, ScheduleBatch
from srt.managers.scheduler import Scheduler
from srt.model_executor.resolve import resolve_device_defaults
from srt.model_executor.sampling_info import RequestSampling
from srt.model_executor.worker_batch import (
    GenerationBatchResult,
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
    for rid, ids, reason, cached, settings in zip(
        out.rids, out.output_ids, out.finished_reasons, out.cached_tokens, out.settings, strict=True
    ):
        # A request's settings cross once, with its first message.
        assert (settings is not None) == (rid not in outputs), rid
        outputs.setdefault(rid, []).extend(ids)
        if reason is not None:
            finished[rid] = Finished(outputs[rid], reason, cached)


# ---- scheduling decisions -------------------------------------------------------------------


def test_new_requests_join_while_others_decode() -> None:
    runner = ScriptedRunner()
    scheduler = scheduler_over(runner)
    scheduler.add_request(request("a", [10, 11, 12], max_new_tokens=4))
    scheduler.step()  # extend a
    scheduler.step()  # decode a
    scheduler.add_request(request("b", [20, 21], max_new_tokens=2))
    finished = run_to_completion(scheduler)
    kinds = [(p.kind, p.new_tokens) for p in runner.passes]
    assert kinds == [
        ("extend", [3]),
        ("decode", [1]),
        ("extend", [2]),  # b is prefilled between a's decode steps
        ("decode", [1, 1]),  # then both decode together
        ("decode", [1]),  # b has its 2 tokens
    ]
    assert finished["a"].output_ids == [13, 14, 15, 16]
    assert finished["b"].output_ids == [22, 23]
    assert finished["a"].reason == FinishReason("length", length=4)


def test_long_prompts_are_prefilled_in_chunks() -> None:
    runner = ScriptedRunner()
    scheduler = scheduler_over(runner, chunked_prefill_size=8)
    scheduler.add_request(request("long", range(2, 22), max_new_tokens=2))  # 20 tokens
    scheduler.add_request(request("short", [30, 31], max_new_tokens=1))
    finished = run_to_completion(scheduler)
    assert [(p.kind, p.new_tokens) for p in runner.passes] == [
        ("extend", [8]),
        ("extend", [8]),
        ("extend", [4, 2]),  # the last chunk leaves room for the next request
        ("decode", [1]),
    ]
    assert finished["long"].output_ids == [22, 23]
    assert finished["short"].output_ids == [32]


@pytest.mark.parametrize(
    ("device", "given", "expected"), [("cpu", None, 4096), ("cuda", None, 8192), ("cpu", 64, 64)]
)
def test_the_chunk_size_defaults_by_device(device: str, given: int | None, expected: int) -> None:
    args = resolve_device_defaults(ServerArgs(chunked_prefill_size=given), torch.device(device))
    assert args.chunked_prefill_size == expected
    assert scheduler_over(ScriptedRunner(), chunked_prefill_size=given).chunked_prefill_size in (
        given,
        4096,
    )


def test_device_defaults_are_resolved_in_one_place() -> None:
    cpu = resolve_device_defaults(ServerArgs(), torch.device("cpu"))
    assert (cpu.device, cpu.dtype, cpu.attention_backend) == ("cpu", "float32", "torch_native")
    assert (cpu.max_running_requests, cpu.mem_fraction_static) == (256, 0.85)
    assert resolve_device_defaults(cpu) == cpu  # resolving again changes nothing
    cuda = resolve_device_defaults(ServerArgs(max_running_requests=3), torch.device("cuda"))
    assert (cuda.device, cuda.dtype, cuda.max_running_requests) == ("cuda", "bfloat16", 3)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve_device_defaults(ServerArgs(attention_backend="flashinfer"), torch.device("cpu"))
    with pytest.raises(ValueError, match="device defaults resolved"):
        Scheduler(ServerArgs(), ScriptedRunner(), tokenizer_path=None)


def test_max_prefill_tokens_and_max_running_requests_bound_a_step() -> None:
    runner = ScriptedRunner(max_running_requests=3)
    scheduler = scheduler_over(runner, max_prefill_tokens=10)
    for i in range(5):
        scheduler.add_request(request(f"r{i}", range(10 + i * 6, 16 + i * 6), max_new_tokens=2))
    run_to_completion(scheduler)
    extends = [p.new_tokens for p in runner.passes if p.kind == "extend"]
    assert extends[0] == [6]  # a second 6-token prompt would pass 10 prefill tokens
    assert all(sum(tokens) <= 10 for tokens in extends)
    assert max(len(p.rids_rows) for p in runner.passes) <= 3


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("fcfs", ["a", "b", "c", "d"]),
        ("lof", ["c", "a", "d", "b"]),
        ("lpm", ["d", "b", "a", "c"]),
        ("dfs-weight", ["b", "d", "a", "c"]),
    ],
)
def test_policies_order_admission(policy: str, expected: list[str]) -> None:
    runner = ScriptedRunner()
    scheduler = scheduler_over(runner, schedule_policy=policy, max_prefill_tokens=1)
    # Cache two prefixes: [40..47] and [50..53].
    scheduler.add_request(request("warm1", range(40, 48), max_new_tokens=1))
    scheduler.add_request(request("warm2", range(50, 54), max_new_tokens=1))
    run_to_completion(scheduler)
    runner.passes.clear()
    scheduler.add_request(request("a", [5, 6, 7], max_new_tokens=3))
    scheduler.add_request(request("b", [*range(50, 54), 9], max_new_tokens=1))
    scheduler.add_request(request("c", [8, 9], max_new_tokens=9))
    scheduler.add_request(request("d", [*range(40, 48), 3], max_new_tokens=2))
    order = []
    while scheduler.waiting:
        before = {req.rid for req in scheduler.waiting}
        scheduler.step()
        order += sorted(before - {req.rid for req in scheduler.waiting})
    assert order == expected
    run_to_completion(scheduler)


def test_requests_sharing_a_prefix_wait_a_step_to_find_it_cached() -> None:
    runner = ScriptedRunner()
    scheduler = scheduler_over(runner)
    system = list(range(10, 50))
    for i in range(3):
        scheduler.add_request(request(f"q{i}", [*system, 60 + i], max_new_tokens=2))
    scheduler.add_request(request("other", [7, 8], max_new_tokens=2))
    finished = run_to_completion(scheduler)
    assert [p.new_tokens for p in runner.passes[:2]] == [[41, 2], [1, 1]]
    assert [finished[f"q{i}"].cached_tokens for i in range(3)] == [0, 40, 40]


def test_random_policy_admits_everything() -> None:
    scheduler = scheduler_over(ScriptedRunner(), schedule_policy="random", random_seed=3)
    for i in range(6):
        scheduler.add_request(request(f"r{i}", [10 + i, 20], max_new_tokens=2))
    assert len(run_to_completion(scheduler)) == 6


def test_retraction_takes_the_request_with_fewest_outputs_and_keeps_outputs() -> None:
    # Admission expects running requests to need only part of their max_new_tokens, so two
    # 34-token requests share a 60-slot pool until they run short near the end.
    scheduler = scheduler_over(ScriptedRunner(max_total_tokens=60), disable_radix_cache=True)
    prompts = {"first": range(10, 14), "second": range(20, 24), "third": range(40, 44)}
    scheduler.add_request(request("first", prompts["first"], max_new_tokens=30))
    for _ in range(3):
        assert scheduler.step() is None  # not streamed: output comes at the finish
    scheduler.add_request(request("second", prompts["second"], max_new_tokens=30))
    scheduler.add_request(request("third", prompts["third"], max_new_tokens=20))
    outputs: dict[str, list[int]] = {}
    finished: dict[str, Finished] = {}
    retracted = []
    while scheduler.has_work():
        before = scheduler.num_retracted
        collect(scheduler.step(), outputs, finished)
        assert scheduler.check_invariants() == []
        if scheduler.num_retracted > before:
            retracted.append(scheduler.waiting.first().rid)
    assert retracted[:1] == ["second"]
    for rid, prompt in prompts.items():
        n = len(finished[rid].output_ids)
        assert finished[rid].output_ids == [(prompt[-1] + 1 + i) % VOCAB for i in range(n)]
    assert [len(finished[rid].output_ids) for rid in prompts] == [30, 30, 20]


def test_finish_reasons() -> None:
    scheduler = scheduler_over(ScriptedRunner())
    scheduler.add_request(request("eos", [EOS - 3], max_new_tokens=10))
    scheduler.add_request(request("ignore", [EOS - 3], max_new_tokens=4, ignore_eos=True))
    scheduler.add_request(request("stop_id", [5], max_new_tokens=10, stop_token_ids=(8,)))
    scheduler.add_request(request("min_new", [EOS - 2], max_new_tokens=5, min_new_tokens=3))
    scheduler.add_request(request("zero", [5], max_new_tokens=0))
    finished = run_to_completion(scheduler)
    assert finished["eos"].output_ids == [EOS - 2, EOS - 1, EOS]
    assert finished["ignore"].output_ids == [EOS - 2, EOS - 1, EOS, EOS + 1]
    assert finished["eos"].reason.to_json() == {"type": "stop", "matched": EOS}
    assert finished["ignore"].reason == FinishReason("length", length=4)
    assert finished["stop_id"].output_ids == [6, 7, 8]
    assert finished["stop_id"].reason == FinishReason("stop", matched_token=8)
    # EOS is banned until three tokens are out: the scripted next token after EOS-1 moves on.
    assert len(finished["min_new"].output_ids) >= 3
    assert finished["zero"].output_ids == []


def test_only_the_first_message_of_a_request_carries_its_settings() -> None:
    scheduler = scheduler_over(ScriptedRunner())
    prompt = [5, 6, 7, 8, 9, 10, 11]
    scheduler.add_request(
        request("r", prompt, max_new_tokens=3, stream=True, skip_special_tokens=False)
    )
    messages = []
    while scheduler.has_work():
        out = scheduler.step()
        if out is not None:
            messages.append(out)
    assert [m.output_ids for m in messages] == [((12,),), ((13,),), ((14,),)]
    assert messages[0].settings == (
        DetokenizeSettings(context_ids=(7, 8, 9, 10, 11), skip_special_tokens=False,
                           no_stop_trim=False, stop=()),
    )  # fmt: skip
    assert [m.settings for m in messages[1:]] == [(None,), (None,)]


def test_requests_that_can_never_fit_are_rejected_at_once() -> None:
    scheduler = scheduler_over(ScriptedRunner(max_total_tokens=64, context_length=100))
    scheduler.add_request(request("ctx", range(2, 52), max_new_tokens=60))
    scheduler.add_request(request("kv", range(2, 42), max_new_tokens=30))
    scheduler.add_request(request("empty", [], max_new_tokens=3))
    scheduler.add_request(request("vocab", [VOCAB], max_new_tokens=3))
    finished = run_to_completion(scheduler)
    messages = {rid: f.reason.message for rid, f in finished.items()}
    assert finished["ctx"].reason.type == "abort"
    assert "50 tokens" in messages["ctx"]
    assert "100 tokens" in messages["ctx"]
    assert "KV cache (64 tokens)" in messages["kv"]
    assert "empty" in messages["empty"]
    assert f"[0, {VOCAB})" in messages["vocab"]
    assert {f.reason.status_code for f in finished.values()} == {400}
    assert finished["kv"].reason.to_json()["status_code"] == 400


def test_duplicate_rid_in_flight_is_rejected() -> None:
    scheduler = scheduler_over(ScriptedRunner())
    scheduler.add_request(request("same", [5, 6], max_new_tokens=4))
    scheduler.add_request(request("same", [7, 8], max_new_tokens=4))
    out = scheduler.step()
    assert out is not None
    rejection = out.finished_reasons[0]
    assert rejection is not None
    assert "already in flight" in rejection.message
    assert rejection.status_code == 400
    run_to_completion(scheduler)


def test_a_full_queue_refuses_with_429_until_requests_are_admitted() -> None:
    scheduler = scheduler_over(ScriptedRunner(max_running_requests=1), max_queued_requests=2)
    for i in range(3):
        scheduler.add_request(request(f"r{i}", [10 + i, 20], max_new_tokens=3))
    scheduler.add_request(request("nothing", [7], max_new_tokens=0))  # never waits: not refused
    out = scheduler.step()  # admits r0: one request waits now
    assert out is not None
    reasons = dict(zip(out.rids, out.finished_reasons, strict=True))
    refusal = reasons["r2"]
    assert refusal is not None
    assert refusal.to_json() == {
        "type": "abort",
        "message": "too many requests: the waiting queue is full (--max-queued-requests 2)",
        "status_code": 429,
    }
    assert reasons["nothing"] == FinishReason("length", length=0)
    scheduler.add_request(request("r3", [13, 20], max_new_tokens=3))
    finished = run_to_completion(scheduler)
    assert {rid: f.reason.type for rid, f in finished.items()} == {
        "r0": "length",
        "r1": "length",
        "r3": "length",
    }


def test_aborts_by_clients_carry_no_status() -> None:
    scheduler = scheduler_over(ScriptedRunner())
    scheduler.add_request(request("a", [5, 6], max_new_tokens=4))
    scheduler.abort("a")
    reason = run_to_completion(scheduler)["a"].reason
    assert reason.status_code == 0
    assert reason.to_json() == {"type": "abort", "message": "aborted by request"}


def test_abort_while_waiting_running_and_chunked_frees_everything() -> None:
    scheduler = scheduler_over(ScriptedRunner(), chunked_prefill_size=4, max_prefill_tokens=4)
    scheduler.add_request(request("run", [5, 6], max_new_tokens=50))
    scheduler.add_request(request("chunk", range(10, 30), max_new_tokens=5))
    scheduler.add_request(request("wait", [7], max_new_tokens=5))
    scheduler.step()
    scheduler.step()
    assert scheduler.chunked_req is not None
    assert scheduler.running
    for rid in ("wait", "chunk", "run"):
        scheduler.abort(rid)
        assert scheduler.check_invariants() == []
    finished = run_to_completion(scheduler)
    assert {f.reason.type for f in finished.values()} == {"abort"}
    assert scheduler.allocator.available_size() + scheduler.tree_cache.evictable_size() == 256  # type: ignore[union-attr]


def test_requests_are_found_by_id_without_scanning_the_queues(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheduler = scheduler_over(ScriptedRunner(max_running_requests=2))
    for i in range(40):
        scheduler.add_request(request(f"r{i}", [5 + i % 50, 6], max_new_tokens=30))
    scheduler.step()
    assert len(scheduler.running) == 2
    assert len(scheduler.waiting) == 38

    def no_scan(queue: ReqQueue) -> Iterator[Req]:
        raise AssertionError("a request was looked up by walking a queue")

    # Finding one request (an abort, a duplicate-rid check) must not walk the queues.
    monkeypatch.setattr(ReqQueue, "__iter__", no_scan)
    scheduler.abort("r30")
    scheduler.abort("r1")
    scheduler.add_request(request("r2", [7], max_new_tokens=1))
    assert len(scheduler.waiting) == 37
    assert len(scheduler.running) == 1
    out = scheduler.take_output()
    monkeypatch.undo()
    assert out is not None
    reasons = dict(zip(out.rids, out.finished_reasons, strict=True))
    assert reasons["r30"] == reasons["r1"] == FinishReason("abort", message="aborted by request")
    assert reasons["r2"] == FinishReason(
        "abort", message="request id 'r2' is already in flight", status_code=400
    )
    assert scheduler.check_invariants() == []
    assert len(run_to_completion(scheduler)) == 38


def test_req_queue_keeps_order_and_removes_only_its_own_request() -> None:
    reqs = [Req(request(f"q{i}", [1, 2], max_new_tokens=1), frozenset()) for i in range(4)]
    queue = ReqQueue()
    for req in reqs[2:]:
        queue.append(req)
    queue.prepend(reqs[:2])
    assert [r.rid for r in queue] == ["q0", "q1", "q2", "q3"]
    assert queue.first() is reqs[0]
    with pytest.raises(ValueError, match="already queued"):
        queue.append(Req(request("q3", [1], max_new_tokens=1), frozenset()))
    impostor = Req(request("q1", [1], max_new_tokens=1), frozenset())
    assert impostor not in queue
    assert not queue.remove(impostor)
    assert queue.remove(reqs[1])
    assert not queue.remove(reqs[1])
    assert [r.rid for r in queue] == ["q0", "q2", "q3"]
    assert queue.get("q2") is reqs[2]
    assert queue.get("q1") is None


def test_abort_all_and_flush_cache() -> None:
    scheduler = scheduler_over(ScriptedRunner())
    for i in range(4):
        scheduler.add_request(request(f"r{i}", [5 + i, 6], max_new_tokens=30))
    scheduler.step()
    assert scheduler.flush_cache() == "requests are in flight"
    scheduler.abort("")
    assert len(run_to_completion(scheduler)) == 4
    assert scheduler.flush_cache() is None
    assert scheduler.allocator.available_size() == 256


# ---- outputs on a real model ------------------------------------------------------------------


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


@pytest.fixture(scope="module")
def tiny_llama(tiny_model_factory: Any) -> Path:
    path: Path = tiny_model_factory("llama")
    return path


@pytest.fixture(scope="module")
def alone_outputs(tiny_llama: Path) -> list[list[int]]:
    scheduler = real_scheduler(tiny_llama, disable_radix_cache=True)
    return [generate(scheduler, [prompt])["r0"].output_ids for prompt in shared_prefix_prompts(16)]


@pytest.mark.slow
def test_concurrent_requests_match_each_alone_and_reuse_the_cache(
    tiny_llama: Path, alone_outputs: list[list[int]]
) -> None:
    scheduler = real_scheduler(tiny_llama, max_prefill_tokens=64)
    finished = generate(scheduler, shared_prefix_prompts(16))
    assert [finished[f"r{i}"].output_ids for i in range(16)] == alone_outputs
    assert sum(f.cached_tokens for f in finished.values()) > 0
    again = generate(scheduler, shared_prefix_prompts(16)[:4])
    assert all(f.cached_tokens > 0 for f in again.values())


@pytest.mark.slow
def test_small_kv_pool_forces_retraction_and_chunks_keep_outputs(
    tiny_llama: Path, alone_outputs: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[RequestSamplingSpec] = []
    build = RequestSampling.of

    def counted(spec: RequestSamplingSpec) -> RequestSampling:
        built.append(spec)
        return build(spec)

    monkeypatch.setattr(RequestSampling, "of", staticmethod(counted))
    scheduler = real_scheduler(tiny_llama, max_total_tokens=160, chunked_prefill_size=16)
    finished = generate(scheduler, shared_prefix_prompts(16))
    assert scheduler.num_retracted > 0
    assert [finished[f"r{i}"].output_ids for i in range(16)] == alone_outputs
    # Each request's sampling state is built once, at its first admission: not per step, not
    # again when a retracted request is admitted again (run_to_completion saw it dropped).
    assert len(built) == 16


@pytest.mark.slow
def test_stop_strings_end_generation(tiny_llama: Path, alone_outputs: list[list[int]]) -> None:
    from srt.managers.incremental_detokenizer import IncrementalDetokenizer

    prompt = shared_prefix_prompts(1)[0]
    detok = IncrementalDetokenizer(tiny_llama)
    detok.add_request("x")
    text = "".join(detok.step("x", [token]) for token in alone_outputs[0])
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    scheduler = real_scheduler(tiny_llama)
    finished = generate(scheduler, [prompt], stop=(stop,))["r0"]
    offset = text.index(stop)
    assert finished.reason == FinishReason("stop", matched_str=stop, matched_offset=offset)
    assert len(finished.output_ids) < len(alone_outputs[0])
    assert finished.output_ids == alone_outputs[0][: len(finished.output_ids)]
    # The token that completes the stop string is also the last allowed one: the stop wins.
    last = generate(scheduler, [prompt], stop=(stop,), max_new_tokens=len(finished.output_ids))
    assert last["r0"].reason == finished.reason
