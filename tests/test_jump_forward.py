"""Jump-forward decoding (`--enable-jump-forward`): the scheduler's bookkeeping, over the
scripted runner, which makes the jumps a test scripts and checks at every pass that each
request's row holds exactly its KV slots: forced ids are extended over after the cached prefix,
only the token just sampled is rolled back, budgets and stop tokens cut a jump, forced tokens
report logprob 0, nothing leaks (`run_to_completion` checks the KV invariant after every step).
The guarantee on the tiny random model is in test_jump_forward_model.py.
"""

from __future__ import annotations

import pytest
from scheduler_helpers import (
    Finished,
    ScriptedRunner,
    collect,
    request,
    run_to_completion,
    scheduler_over,
)

from srt.managers.scheduler import Scheduler
from srt.model_executor.worker_batch import GRAMMAR_READY, JumpForward

GRAMMAR = ("json_schema", "{}")


def scripted(jumps: dict[str, list[JumpForward]]) -> tuple[ScriptedRunner, Scheduler]:
    runner = ScriptedRunner(jumps=jumps)
    runner.grammars[GRAMMAR] = GRAMMAR_READY
    return runner, scheduler_over(runner, enable_jump_forward=True)


def test_forced_ids_are_extended_over_after_the_cached_prefix() -> None:
    runner, scheduler = scripted({"a": [JumpForward(0, [40, 41, 42])]})
    scheduler.add_request(request("a", [10, 11, 12], max_new_tokens=8, json_schema="{}"))
    done = run_to_completion(scheduler)["a"]
    # The prompt's pass samples 13; the jump appends 40-42; one extend over 13 and 40-42 (the
    # prompt from the cache) samples 43; decode steps do the rest.
    assert done.output_ids == [13, 40, 41, 42, 43, 44, 45, 46]
    assert done.reason.type == "length"
    assert [(p.kind, p.new_tokens) for p in runner.passes] == [
        ("extend", [3]),
        ("extend", [4]),
        ("decode", [1]),
        ("decode", [1]),
        ("decode", [1]),
    ]
    assert scheduler.batch_log.num_batches == 5
    assert (scheduler.jump_forward.num_jumps, scheduler.jump_forward.num_forced_tokens) == (1, 3)
    assert runner.jump_asks[0] == ("a", 1, 7)  # the sampled 13 is unsent; 7 tokens to go


def test_only_the_token_just_sampled_rolls_back() -> None:
    jumps = {
        rid: [JumpForward(1, [30, 31, 32]), JumpForward(2, [40, 41]), JumpForward(1, [50, 51])]
        for rid in ("quiet", "stream")
    }
    runner, scheduler = scripted(jumps)
    for rid, streamed in (("quiet", False), ("stream", True)):
        scheduler.add_request(
            request(rid, [10, 11, 12], max_new_tokens=9, json_schema="{}", stream=streamed)
        )
    outputs: dict[str, list[int]] = {}
    done: dict[str, Finished] = {}
    while scheduler.has_work():
        collect(scheduler.step(), outputs, done)
        assert scheduler.check_invariants() == []
    # 13 is replaced by 30-32, and 33 sampled after them; the next jump would replace 32 too:
    # refused, it waits while the request decodes 34.
    for rid in ("quiet", "stream"):
        assert done[rid].output_ids == [30, 31, 32, 33, 34, 35, 36, 37, 38], rid
        assert jumps[rid][0] == JumpForward(2, [40, 41])
    assert {rollback for _, rollback, _ in runner.jump_asks} == {1}
    assert not runner.specs


def test_a_jump_stops_at_max_new_tokens_and_at_a_stop_token() -> None:
    jumps = {"short": [JumpForward(0, [40, 41, 42, 43])], "stop": [JumpForward(0, [40, 41, 42])]}
    runner, scheduler = scripted(jumps)
    scheduler.add_request(request("short", [10, 11], max_new_tokens=3, json_schema="{}"))
    scheduler.add_request(
        request("stop", [20, 21], max_new_tokens=9, json_schema="{}", stop_token_ids=[41])
    )
    done = run_to_completion(scheduler)
    assert done["short"].output_ids == [12, 40, 41]  # the runner cut the jump to the budget
    assert (done["short"].reason.type, done["short"].reason.length) == ("length", 3)
    assert done["stop"].output_ids == [22, 40, 41]  # 42 is dropped
    assert (done["stop"].reason.type, done["stop"].reason.matched_token) == ("stop", 41)
    assert len(runner.passes) == 1  # both ended in their jump


def test_forced_tokens_report_logprob_zero() -> None:
    _, scheduler = scripted({"a": [JumpForward(1, [50, 51])]})
    scheduler.add_request(
        request(
            "a",
            [10, 11],
            max_new_tokens=4,
            json_schema="{}",
            return_logprob=True,
            top_logprobs_num=2,
        )
    )
    scheduler.step()
    req = scheduler.waiting.get("a")
    assert req is not None
    assert req.output_ids == [50, 51]  # 12 and its logprob rolled back
    assert req.output_logprobs == [0.0, 0.0]
    assert req.output_top_logprobs == [((50, 0.0),), ((51, 0.0),)]
    run_to_completion(scheduler)


@pytest.mark.parametrize(
    "settings", [{}, {"enable_jump_forward": True, "disable_radix_cache": True}]
)
def test_jump_forward_is_off_by_default_and_without_the_radix_cache(
    settings: dict[str, bool],
) -> None:
    runner = ScriptedRunner(jumps={"a": [JumpForward(0, [40, 41, 42])]})
    runner.grammars[GRAMMAR] = GRAMMAR_READY
    scheduler = scheduler_over(runner, **settings)
    scheduler.add_request(request("a", [10, 11], max_new_tokens=4, json_schema="{}"))
    assert run_to_completion(scheduler)["a"].output_ids == [12, 13, 14, 15]
    assert not runner.jump_asks
