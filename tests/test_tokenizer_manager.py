"""The TokenizerManager on real rings, in one process: the test plays the other side of the
rings (what the scheduler receives, what the detokenizer sends), so that it decides when each
result arrives, what a stage answers, and when a stage goes away."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from srt.io_struct import (
    AbortReq,
    BatchStrOut,
    FinishReason,
    FlushCacheOut,
    FlushCacheReq,
    GetLoadOut,
    GetLoadReq,
    Message,
    TokenizedGenerateReq,
)
from srt.ipc.channel import Receiver, Sender
from srt.ipc.rings import RingNames
from srt.managers.generate_req_input import GenerateReqInput
from srt.managers.tokenizer_manager import EngineDeadError, TokenizerManager
from srt.server_args import ServerArgs

CONTEXT = 256
ONE = {"max_new_tokens": 1}
M = TypeVar("M")


@pytest.fixture(scope="module")
def model_dir(tiny_model_factory: Callable[[str], Path]) -> Path:
    return tiny_model_factory("llama")


class Peer:
    """The scheduler's receiving end and the detokenizer's sending end."""

    def __init__(self, rings: RingNames) -> None:
        self.recv = Receiver(rings.scheduler)
        self.send = Sender(rings.tokenizer)
        # What the launcher would say when a stage process dies.
        self.stage_exit: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def expect(self, kind: type[M]) -> M:
        msg = await asyncio.wait_for(self.recv.recv(), 10)
        assert isinstance(msg, kind), msg
        return msg

    def nothing_sent(self) -> bool:
        return self.recv.recv_nowait() is None

    async def out(
        self,
        rid: str,
        text: str,
        ids: tuple[int, ...],
        reason: FinishReason | None = None,
        logprobs: tuple[float, ...] = (),
    ) -> None:
        top = tuple(((t, lp),) for t, lp in zip(ids, logprobs, strict=False))
        await self.send.send(
            BatchStrOut(
                rids=(rid,),
                output_strs=(text,),
                output_ids=(ids,),
                finished_reasons=(reason,),
                prompt_tokens=(4,),
                completion_tokens=(len(ids),),
                cached_tokens=(2,),
                output_logprobs=(logprobs,),
                output_top_logprobs=(top,),
                input_token_logprobs=((),),
                input_top_logprobs=((),),
            )
        )


Scenario = Callable[[TokenizerManager, Peer], Awaitable[None]]


def run(model_dir: Path, scenario: Scenario) -> None:
    """Runs `scenario` against a started TokenizerManager on fresh rings."""
    rings = RingNames.new()
    rings.create(1 << 16)
    args = ServerArgs(model_path=str(model_dir), context_length=CONTEXT)

    async def main() -> None:
        manager = TokenizerManager(args, Sender(rings.scheduler), Receiver(rings.tokenizer))
        peer = Peer(rings)
        manager.start(stage_exit=peer.stage_exit)
        try:
            await scenario(manager, peer)
        finally:
            await manager.close()
            for channel in (peer.recv, manager.send_to_scheduler, manager.recv_from_detokenizer):
                channel.close()
            with contextlib.suppress(AttributeError):  # a scenario may close it first
                peer.send.close()

    try:
        asyncio.run(main())
    finally:
        rings.unlink()


async def collect(manager: TokenizerManager, **kwargs: Any) -> list[dict[str, Any]]:
    return [r async for r in manager.generate_request(GenerateReqInput(**kwargs))]


async def until(condition: Callable[[], bool], timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


@contextlib.contextmanager
def raises_before_sending(peer: Peer, message: str) -> Iterator[None]:
    with pytest.raises(ValueError, match=message):
        yield
    assert peer.nothing_sent()


def test_a_request_is_tokenized_sent_and_its_result_assembled(model_dir: Path) -> None:
    async def scenario(manager: TokenizerManager, peer: Peer) -> None:
        call = asyncio.ensure_future(
            collect(manager, text="hello", rid="r", return_logprob=True, top_logprobs_num=1)
        )
        req = await peer.expect(TokenizedGenerateReq)
        assert req.rid == "r"
        assert list(req.input_ids) == manager.tokenizer.encode("hello")
        assert req.return_logprob
        assert req.top_logprobs_num == 1
        await peer.out("r", "Hel", (7, 8), logprobs=(-0.1, -0.2))
        await peer.out("r", "lo", (9,), FinishReason("length", length=3), logprobs=(-0.3,))
        (result,) = await call
        assert result["text"] == "Hello"
        assert result["output_ids"] == [7, 8, 9]
        meta = result["meta_info"]
        assert meta["id"] == "r"
        assert meta["prompt_tokens"] == len(req.input_ids)
        assert meta["completion_tokens"] == 1  # the scheduler's count, as the last message has it
        assert meta["cached_tokens"] == 2
        assert meta["finish_reason"] == {"type": "length", "length": 3}
        assert meta["e2e_latency"] >= 0
        assert meta["output_token_logprobs"] == [(-0.1, 7, None), (-0.2, 8, None), (-0.3, 9, None)]
        assert meta["output_top_logprobs"] == [
            [(-0.1, 7, None)],
            [(-0.2, 8, None)],
            [(-0.3, 9, None)],
        ]
        assert "index" not in result
        assert manager.rid_to_state == {}

    run(model_dir, scenario)


def test_streamed_chunks_carry_what_is_new_and_the_finish_on_the_last(model_dir: Path) -> None:
    async def scenario(manager: TokenizerManager, peer: Peer) -> None:
        stream = manager.generate_request(GenerateReqInput(text="x", rid="s", stream=True))
        first = asyncio.ensure_future(anext(stream))
        await peer.expect(TokenizedGenerateReq)
        await peer.out("s", "a", (1,))
        chunk = await first
        assert (chunk["text"], chunk["output_ids"]) == ("a", [1])
        assert chunk["meta_info"]["finish_reason"] is None
        await peer.out("s", "b", (2,))
        await peer.out("s", "", (3,))
        await peer.out("s", "c", (4,), FinishReason("stop", matched_token=4))
        rest = [c async for c in stream]
        assert "".join(c["text"] for c in rest) == "bc"
        assert [t for c in rest for t in c["output_ids"]] == [2, 3, 4]
        assert [c["meta_info"]["finish_reason"] for c in rest][-1] == {"type": "stop", "matched": 4}
        assert all(c["meta_info"]["finish_reason"] is None for c in rest[:-1])

    run(model_dir, scenario)


def test_batches_and_samples_stream_with_their_index(model_dir: Path) -> None:
    async def scenario(manager: TokenizerManager, peer: Peer) -> None:
        obj = GenerateReqInput(
            text=["a", "b"], rid=["p", "q"], sampling_params={"n": 2}, stream=True
        )
        call = asyncio.ensure_future(_gather(manager.generate_request(obj)))
        reqs = [await peer.expect(TokenizedGenerateReq) for _ in range(4)]
        assert [r.rid for r in reqs] == ["p-0", "p-1", "q-0", "q-1"]
        for i, r in enumerate(reversed(reqs)):
            await peer.out(r.rid, r.rid, (i,), FinishReason("length", length=1))
        chunks = await call
        assert sorted((c["index"], c["text"]) for c in chunks) == [
            (0, "p-0"),
            (1, "p-1"),
            (2, "q-0"),
            (3, "q-1"),
        ]

    run(model_dir, scenario)


async def _gather(stream: AsyncIterator[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c async for c in stream]


def test_callers_wait_their_turn_while_the_scheduler_ring_is_full(model_dir: Path) -> None:
    async def scenario(manager: TokenizerManager, peer: Peer) -> None:
        ids = list(range(1, 201))  # ~1 KiB a request: 100 of them overfill the 64 KiB ring
        calls = [
            asyncio.ensure_future(collect(manager, input_ids=ids, rid=f"r{i}", sampling_params=ONE))
            for i in range(100)
        ]
        await asyncio.sleep(0.1)
        assert manager.sending > 0, "the ring never filled up"
        reqs = [await peer.expect(TokenizedGenerateReq) for _ in range(100)]
        assert sorted(r.rid for r in reqs) == sorted(f"r{i}" for i in range(100))
        for r in reqs:
            await peer.out(r.rid, r.rid, (1,), FinishReason("length", length=1))
        results = await asyncio.gather(*calls)
        assert [res[0]["text"] for res in results] == [f"r{i}" for i in range(100)]
        assert manager.sending == 0

    run(model_dir, scenario)


def test_a_cancelled_caller_aborts_and_its_id_stays_taken_until_the_scheduler_lets_go(
    model_dir: Path,
) -> None:
    async def scenario(manager: TokenizerManager, peer: Peer) -> None:
        call = asyncio.ensure_future(collect(manager, text="x", rid="c"))
        await peer.expect(TokenizedGenerateReq)
        call.cancel()
        assert (await peer.expect(AbortReq)).rid == "c"
        with raises_before_sending(peer, "already in flight"):
            await collect(manager, text="x", rid="c")
        await peer.out("c", "", (), FinishReason("abort", message="aborted"))
        await until(lambda: "c" not in manager.rid_to_state)
        again = asyncio.ensure_future(collect(manager, text="x", rid="c"))
        await peer.expect(TokenizedGenerateReq)
        await peer.out("c", "ok", (1,), FinishReason("length", length=1))
        assert [r["text"] for r in await again] == ["ok"]

    run(model_dir, scenario)


def test_leaving_a_stream_early_aborts_the_request(model_dir: Path) -> None:
    async def scenario(manager: TokenizerManager, peer: Peer) -> None:
        stream = manager.generate_request(GenerateReqInput(text="x", rid="e", stream=True))
        first = asyncio.ensure_future(anext(stream))
        await peer.expect(TokenizedGenerateReq)
        await peer.out("e", "a", (1,))
        await first
        await stream.aclose()
        assert (await peer.expect(AbortReq)).rid == "e"

    run(model_dir, scenario)


def test_abort_request_ends_the_call_with_the_abort_reason(model_dir: Path) -> None:
    async def scenario(manager: TokenizerManager, peer: Peer) -> None:
        assert not await manager.abort_request("nobody")
        call = asyncio.ensure_future(collect(manager, text="x", rid="a"))
        await peer.expect(TokenizedGenerateReq)
        assert await manager.abort_request("a")
        assert (await peer.expect(AbortReq)).rid == "a"
        await peer.out("a", "par", (1,), FinishReason("abort", message="aborted by request"))
        (result,) = await call
        assert result["text"] == "par"
        assert result["meta_info"]["finish_reason"] == {
            "type": "abort",
            "message": "aborted by request",
        }

    run(model_dir, scenario)


def test_bad_requests_are_refused_before_anything_is_sent(model_dir: Path) -> None:
    async def scenario(manager: TokenizerManager, peer: Peer) -> None:
        long_prompt = "word " * 300
        n = len(manager.tokenizer.encode(long_prompt))
        with raises_before_sending(peer, f"the prompt has {n} tokens.*context length of {CONTEXT}"):
            await collect(manager, text=long_prompt)
        with raises_before_sending(peer, f"max_new_tokens is 250: .* context length of {CONTEXT}"):
            await collect(
                manager, input_ids=list(range(10)), sampling_params={"max_new_tokens": 250}
            )
        with raises_before_sending(peer, "the prompt is empty"):
            await collect(manager, input_ids=[])
        vocab = manager.vocab_size
        with raises_before_sending(peer, f"token id {vocab}, outside the vocabulary"):
            await collect(manager, input_ids=[1, vocab])
        with raises_before_sending(peer, "stop_token_ids holds token id"):
            await collect(manager, text="x", sampling_params={"stop_token_ids": [vocab + 5]})
        with raises_before_sending(peer, "sampling parameter top_p"):
            await collect(manager, text="x", sampling_params={"top_p": 0})
        with raises_before_sending(peer, "request id 'd' is already in flight"):
            await collect(manager, text=["x", "y"], rid=["d", "d"])
        # One bad prompt refuses the whole batch.
        with raises_before_sending(peer, "the prompt is empty"):
            await collect(manager, input_ids=[[1, 2], []])
        assert manager.rid_to_state == {}

    run(model_dir, scenario)


def test_a_request_of_many_samples_lets_other_tasks_run_while_it_is_sent(model_dir: Path) -> None:
    n = 128

    async def scenario(manager: TokenizerManager, peer: Peer) -> None:
        call = asyncio.ensure_future(
            collect(manager, text="x", rid="m", sampling_params={"n": n, "max_new_tokens": 1})
        )
        sent_seen: set[int] = set()  # how many samples were out each time this task got to run
        async with asyncio.timeout(10):
            while not sent_seen or max(sent_seen) < n:
                sent_seen.add(sum(s.sent for s in manager.rid_to_state.values()))
                await asyncio.sleep(0)
        assert any(0 < sent < n for sent in sent_seen), sorted(sent_seen)
        for _ in range(n):
            req = await peer.expect(TokenizedGenerateReq)
            await peer.out(req.rid, "t", (1,), FinishReason("length", length=1))
        assert len(await call) == n

    run(model_dir, scenario)


def test_max_new_tokens_none_fills_the_context(model_dir: Path) -> None:
    async def scenario(manager: TokenizerManager, peer: Peer) -> None:
        call = asyncio.ensure_future(
            collect(manager, input_ids=[1, 2, 3], sampling_params={"max_new_tokens": None})
        )
        req = await peer.expect(TokenizedGenerateReq)
        assert req.sampling_params.max_new_tokens == CONTEXT - 3
        await peer.out(req.rid, "", (), FinishReason("length", length=0))
        await call

    run(model_dir, scenario)


def test_control_replies_reach_their_callers(model_dir: Path) -> None:
    async def scenario(manager: TokenizerManager, peer: Peer) -> None:
        flush = asyncio.ensure_future(manager.flush_cache())
        load = asyncio.ensure_future(manager.get_load())
        flush_req = await peer.expect(FlushCacheReq)
        load_req = await peer.expect(GetLoadReq)
        await peer.send.send(GetLoadOut(load_req.rid, 1, 2, 3, 4))
        await peer.send.send(FlushCacheOut(flush_req.rid, False, "busy"))
        assert await flush == FlushCacheOut(flush_req.rid, False, "busy")
        assert (await load).num_waiting_reqs == 2
        assert manager.pending_replies == {}

    run(model_dir, scenario)


def test_a_stage_gone_fails_waiting_and_later_calls(model_dir: Path) -> None:
    async def scenario(manager: TokenizerManager, peer: Peer) -> None:
        call = asyncio.ensure_future(collect(manager, text="x"))
        control = asyncio.ensure_future(manager.health_check())
        await peer.expect(TokenizedGenerateReq)
        peer.send.close()  # the detokenizer is gone
        with pytest.raises(EngineDeadError, match="detokenizer"):
            await asyncio.wait_for(call, 10)
        with pytest.raises(EngineDeadError, match="detokenizer"):
            await asyncio.wait_for(control, 10)
        with pytest.raises(EngineDeadError, match="detokenizer"):
            await collect(manager, text="x")

    run(model_dir, scenario)


def test_the_launchers_word_on_a_dead_stage_reaches_every_caller(model_dir: Path) -> None:
    async def scenario(manager: TokenizerManager, peer: Peer) -> None:
        call = asyncio.ensure_future(collect(manager, text="x", stream=True))
        await peer.expect(TokenizedGenerateReq)
        peer.stage_exit.set_result("scheduler process (pid 1) was killed by SIGKILL")
        with pytest.raises(EngineDeadError, match="SIGKILL"):
            await asyncio.wait_for(call, 10)
        assert manager.rid_to_state == {}

    run(model_dir, scenario)


def test_messages_from_the_detokenizer_are_typed(model_dir: Path) -> None:
    async def scenario(manager: TokenizerManager, peer: Peer) -> None:
        msg: Message = AbortReq("x")
        with pytest.raises(TypeError, match="cannot handle AbortReq"):
            manager.dispatch(msg)

    run(model_dir, scenario)
