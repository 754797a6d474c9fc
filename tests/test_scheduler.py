"""The scheduler's decisions, step by step, with the KV invariant checked after every step.

Scheduling decisions (batch composition, chunk sizes, policy order, retraction order) run over
`ScriptedRunner`, a model runner that returns ids, whose next token is a fixed function of the
last input token, so that each step's batch is known in advance; it checks the request-to-token
rows that the batches write. Outputs on a real model are in
`test_scheduler_outputs.py`; the shared helpers in `scheduler_helpers.py`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from scheduler_helpers import (
    EOS,
    VOCAB,
    Finished,
    ScriptedRunner,
    collect,
    request,
    run_to_completion,
    scheduler_over,
)

from srt.io_struct import DetokenizeSettings, FinishReason
from srt.kernels.cpu import cpu_kernels
from srt.managers.req_queue import ReqQueue
from srt.managers.schedule_batch import Req
from srt.managers.scheduler import Scheduler
from srt.model_executor.resolve import resolve_device_defaults
from srt.server_args import ServerArgs

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
    ("device", "given", "expected"), [("cpu", None, 2048), ("cuda", None, 8192), ("cpu", 64, 64)]
)
def test_the_chunk_size_defaults_by_device(device: str, given: int | None, expected: int) -> None:
    args = resolve_device_defaults(ServerArgs(chunked_prefill_size=given), torch.device(device))
    assert args.chunked_prefill_size == expected
    assert scheduler_over(ScriptedRunner(), chunked_prefill_size=given).chunked_prefill_size in (
        given,
        2048,
    )


def test_device_defaults_are_resolved_in_one_place() -> None:
    cpu = resolve_device_defaults(ServerArgs(), torch.device("cpu"))
    cpu_dtype = "bfloat16" if cpu_kernels.native_bf16_matmul() else "float32"
    assert (cpu.device, cpu.dtype, cpu.attention_backend) == ("cpu", cpu_dtype, "cpu")
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
