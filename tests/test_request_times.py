"""Stage times: what the scheduler stamps (on the scripted runner) and the breakdown the main
process builds from all the points (`RequestTimes`)."""

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

from srt.io_struct import ReqTimeStats
from srt.managers.recent_requests import RecentRequests
from srt.managers.request_times import POINTS, STAGES, RequestTimes
from srt.managers.scheduler import Scheduler


def times(**points: float) -> RequestTimes:
    out = RequestTimes(points.pop("received"))
    for name, at in points.items():
        setattr(out, name, at)
    return out


def test_stages_are_the_spans_between_consecutive_points() -> None:
    full = times(**{name: 10.0 + i * (i + 1) / 2 for i, name in enumerate(POINTS)})
    stages = full.stages()
    assert list(stages) == list(STAGES)
    assert list(stages.values()) == pytest.approx([1, 2, 3, 4, 5, 6, 7, 8])
    assert full.log_fields().split() == [
        f"{stage}={1e3 * (i + 1):.2f}ms" for i, stage in enumerate(STAGES)
    ]


def test_a_point_not_reached_folds_its_stage_into_the_one_before() -> None:
    # Aborted while queued, and its caller went away: no batch, no token, no answer.
    aborted = times(received=1, tokenized=2, sent=3, queued=5, finished=9, detokenized=10)
    assert aborted.stages() == {
        "tokenize": 1,
        "send": 1,
        "transfer": 2,
        "queue": 4,
        "detokenize": 1,
    }
    assert sum(aborted.stages().values()) == 10 - 1
    meta = aborted.meta_info(completion_tokens=0)
    assert "queue_time" not in meta
    assert "prefill_finished_ts" not in meta
    assert "response_sent_to_client_ts" not in meta
    reached = {"received": 1, "tokenized": 2, "sent": 3, "queued": 5, "finished": 9}
    assert meta["time_stats"] == reached | {"detokenized": 10}


def test_meta_info_uses_sglangs_names_for_sglangs_fields() -> None:
    t = times(received=100, tokenized=100.5, sent=101)
    t.absorb(ReqTimeStats(0, queued=102, scheduled=104, first_token=107, finished=111), 112)
    t.answered = 113
    meta = t.meta_info(completion_tokens=9)
    assert meta["request_received_ts"] == 100
    assert meta["request_sent_to_scheduler_ts"] == 101
    assert meta["prefill_finished_ts"] == 107
    assert meta["decode_finished_ts"] == 111
    assert meta["response_sent_to_client_ts"] == 113
    assert meta["queue_time"] == 2
    assert meta["decode_throughput"] == 9 / 4
    assert meta["time_stats"] == t.points()
    assert sum(meta["stage_latencies"].values()) == 13


def finished_times(scheduler: Scheduler) -> dict[str, ReqTimeStats]:
    return {rid: f.times for rid, f in run_to_completion(scheduler).items() if f.times}


def test_the_scheduler_stamps_admission_first_token_and_finish() -> None:
    scheduler = scheduler_over(ScriptedRunner(), chunked_prefill_size=4, max_prefill_tokens=4)
    scheduler.add_request(request("chunked", range(10, 30), max_new_tokens=3))
    scheduler.add_request(request("zero", [5], max_new_tokens=0))
    stats = finished_times(scheduler)
    chunked = stats["chunked"]
    # Five chunks: admitted with the first, first token with the last.
    assert 0 < chunked.queued <= chunked.scheduled < chunked.first_token <= chunked.finished
    zero = stats["zero"]
    assert zero.scheduled == zero.first_token == 0
    assert zero.finished >= zero.queued > 0


def test_a_retracted_request_keeps_its_first_admission_and_token() -> None:
    scheduler = scheduler_over(ScriptedRunner(max_total_tokens=60), disable_radix_cache=True)
    for rid, start in (("first", 10), ("second", 20), ("third", 40)):
        scheduler.add_request(request(rid, range(start, start + 4), max_new_tokens=30))
    first_stamps: dict[str, tuple[float, float]] = {}
    outputs: dict[str, list[int]] = {}
    finished: dict[str, Finished] = {}
    while scheduler.has_work():
        before = scheduler.num_retracted
        for req in scheduler.running:
            first_stamps.setdefault(req.rid, (req.scheduled_at, req.first_token_at))
        collect(scheduler.step(), outputs, finished)
        if scheduler.num_retracted > before:
            retracted = scheduler.waiting.first()
            assert (retracted.scheduled_at, retracted.first_token_at) == first_stamps[retracted.rid]
    assert scheduler.num_retracted > 0
    for rid, f in finished.items():
        assert f.times is not None
        assert (f.times.scheduled, f.times.first_token) == first_stamps[rid]


def test_an_abort_in_the_queue_has_no_model_stages() -> None:
    scheduler = scheduler_over(ScriptedRunner())
    scheduler.add_request(request("a", [5, 6], max_new_tokens=4))
    scheduler.abort("a")
    stats = finished_times(scheduler)["a"]
    assert stats.scheduled == stats.first_token == 0
    assert stats.finished >= stats.queued


def test_recent_requests_keep_a_bounded_window_and_sort_the_slowest() -> None:
    recent = RecentRequests(capacity=3)
    for i, e2e in enumerate((0.5, 2.0, 1.0, 0.1)):
        recent.add(f"r{i}", "length", e2e, times(received=1, tokenized=1 + e2e))
    assert recent.get("r0") is None  # the oldest went first
    assert [e["rid"] for e in recent.slowest(2)] == ["r1", "r2"]
    recent.add("r1", "abort", 0.05, times(received=1))  # an id reused replaces its entry
    assert [e["rid"] for e in recent.slowest()] == ["r2", "r3", "r1"]
    entry = recent.get("r2")
    assert entry is not None
    assert entry["stage_latencies"] == {"tokenize": 1.0}
    assert entry["time_stats"] == {"received": 1, "tokenized": 2.0}
