"""`ReqQueue`: the scheduler's waiting and running requests, in order, by request id.

An insertion-ordered dict keyed by rid: appending, finding, and removing one request cost O(1),
so an abort or an admission never scans the queue (a server holding thousands of waiting requests
pays per step only for the requests it looks at). Request ids are unique among live requests (the
scheduler refuses a second request with a rid in flight), so the rid identifies the entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from srt.managers.schedule_batch import Req


class ReqQueue:
    """Requests in arrival order (or the order they were put back in), keyed by rid."""

    __slots__ = ("_reqs",)

    def __init__(self) -> None:
        self._reqs: dict[str, Req] = {}

    def append(self, req: Req) -> None:
        """Adds `req` at the end; its rid must not be in the queue."""
        if req.rid in self._reqs:
            raise ValueError(f"request id {req.rid!r} is already queued")
        self._reqs[req.rid] = req

    def prepend(self, reqs: Iterable[Req]) -> None:
        """Puts `reqs` in front, in their order (retracted requests go back first). O(len)."""
        front = {req.rid: req for req in reqs}
        if front.keys() & self._reqs.keys():
            raise ValueError("a request put back in front is already queued")
        self._reqs = front | self._reqs

    def get(self, rid: str) -> Req | None:
        """The request with id `rid`, or None."""
        return self._reqs.get(rid)

    def remove(self, req: Req) -> bool:
        """Removes `req` if it is this very request in the queue; returns whether it was."""
        if self._reqs.get(req.rid) is not req:
            return False
        del self._reqs[req.rid]
        return True

    def first(self) -> Req:
        """The request at the front (IndexError when empty)."""
        for req in self._reqs.values():
            return req
        raise IndexError("the queue is empty")

    def __contains__(self, req: object) -> bool:
        return isinstance(req, Req) and self._reqs.get(req.rid) is req

    def __iter__(self) -> Iterator[Req]:
        return iter(self._reqs.values())

    def __len__(self) -> int:
        return len(self._reqs)
