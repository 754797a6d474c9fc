"""The last finished requests of the main process, with their stage breakdown: what
`/get_server_info` shows as the slowest recent requests, and `/request_times/{rid}` as one
request's (the playground asks for its own last answer's).

Bounded (`CAPACITY` requests, the oldest dropped first), so a busy server keeps a moving
window; adding a request is O(1), and the slowest are sorted only when asked for.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from srt.managers.request_times import RequestTimes

CAPACITY = 1024
SLOWEST = 10


class RecentRequests:
    """The breakdowns of the last `capacity` finished requests, by request id."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self.by_rid: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def add(self, rid: str, finish_reason: str, e2e_latency: float, times: RequestTimes) -> None:
        """Records a finished request (a reused id replaces its older entry)."""
        self.by_rid.pop(rid, None)
        self.by_rid[rid] = {
            "rid": rid,
            "finish_reason": finish_reason,
            "e2e_latency": e2e_latency,
            "stage_latencies": times.stages(),
            "time_stats": {name: at for name, at in times.points().items() if at},
        }
        if len(self.by_rid) > self.capacity:
            self.by_rid.popitem(last=False)

    def get(self, rid: str) -> dict[str, Any] | None:
        """The breakdown of request `rid`, if it is among the recent ones."""
        return self.by_rid.get(rid)

    def slowest(self, count: int = SLOWEST) -> list[dict[str, Any]]:
        """The `count` recent requests with the longest end-to-end latency, slowest first."""
        entries = sorted(self.by_rid.values(), key=lambda e: e["e2e_latency"], reverse=True)
        return entries[:count]
