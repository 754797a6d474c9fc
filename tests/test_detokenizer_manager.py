"""The detokenizer stage: streamed text against Hugging Face decoding, stop-string trimming and
its finish reason, the life of each request's state, and the stage's loop on real rings."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from srt.io_struct import (
    BatchStrOut,
    BatchTokenIDOut,
    FinishReason,
    FlushCacheOut,
    HealthCheckOut,
    Message,
    ShutdownReq,
)
from srt.ipc.channel import Receiver, Sender
from srt.ipc.rings import RingNames
from srt.managers.detokenizer_manager import DetokenizerManager
from srt.server_args import ServerArgs
from srt.testing.smollm2 import smollm2_gguf

LENGTH = FinishReason("length", length=64)
TEXT = "Hi 👋🏽 there, 中文 and more text; stop here, then some more after it"


@pytest.fixture(scope="module")
def model_dir(tiny_model_factory: Callable[[str], Path]) -> Path:
    return tiny_model_factory("qwen2")


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(model_dir)


@contextlib.contextmanager
def make_manager(args: ServerArgs) -> Iterator[tuple[DetokenizerManager, RingNames]]:
    """A detokenizer stage on fresh rings, in this process."""
    rings = RingNames.new()
    rings.create(1 << 16)
    try:
        manager = DetokenizerManager(args, rings)
        yield manager, rings
        manager.recv_from_scheduler.close()
        manager.send_to_tokenizer.close()
    finally:
        rings.unlink()


@pytest.fixture
def staged(model_dir: Path) -> Iterator[tuple[DetokenizerManager, RingNames]]:
    with make_manager(ServerArgs(model_path=str(model_dir))) as staged:
        yield staged


@pytest.fixture
def manager(staged: tuple[DetokenizerManager, RingNames]) -> DetokenizerManager:
    return staged[0]


def token_out(
    rids: Sequence[str],
    ids: Sequence[Sequence[int]],
    reasons: Sequence[FinishReason | None],
    *,
    stop: Sequence[str] = (),
    no_stop_trim: bool = False,
    context: Sequence[int] = (),
    logprobs: bool = False,
) -> BatchTokenIDOut:
    n = len(rids)
    return BatchTokenIDOut(
        rids=tuple(rids),
        output_ids=tuple(tuple(x) for x in ids),
        finished_reasons=tuple(reasons),
        prompt_tokens=(len(context),) * n,
        completion_tokens=tuple(len(x) for x in ids),
        cached_tokens=(3,) * n,
        context_ids=(tuple(context),) * n,
        skip_special_tokens=(True,) * n,
        spaces_between_special_tokens=(True,) * n,
        no_stop_trim=(no_stop_trim,) * n,
        stop=(tuple(stop),) * n,
        output_logprobs=tuple(tuple(-0.5 for _ in x) for x in ids) if logprobs else ((),) * n,
        output_top_logprobs=(
            tuple(tuple(((t, -0.5),) for t in x) for x in ids) if logprobs else ((),) * n
        ),
        input_token_logprobs=((-1.5,),) * n if logprobs else ((),) * n,
        input_top_logprobs=((((2, -1.5),),),) * n if logprobs else ((),) * n,
    )


def stream(
    manager: DetokenizerManager,
    ids: Sequence[int],
    size: int,
    final: FinishReason = LENGTH,
    **options: object,
) -> tuple[list[str], FinishReason | None]:
    """Sends `ids` for request "r" in messages of `size` ids, the last one finished; returns
    the text of each message and the last message's finish reason."""
    pieces = []
    out: BatchStrOut | None = None
    for start in range(0, len(ids), size):
        last = start + size >= len(ids)
        chunk = ids[start : start + size]
        msg = token_out(["r"], [chunk], [final if last else None], **options)  # type: ignore[arg-type]
        out = manager.detokenize(msg)
        assert out.finished_reasons[0] is None or last
        pieces.append(out.output_strs[0])
    assert out is not None
    return pieces, out.finished_reasons[0]


@pytest.mark.parametrize("size", [1, 2, 5])
def test_streamed_text_adds_up_to_hf_decode_and_the_state_is_freed(
    manager: DetokenizerManager, hf: PreTrainedTokenizerBase, size: int
) -> None:
    ids = hf.encode(TEXT)
    pieces, reason = stream(manager, ids, size)
    assert "".join(pieces) == hf.decode(ids, skip_special_tokens=True)
    assert reason == LENGTH
    assert len(manager.detokenizer) == 0
    assert manager.matched_stops == {}


def test_requests_interleave_within_batches(
    manager: DetokenizerManager, hf: PreTrainedTokenizerBase
) -> None:
    a, b = hf.encode("first request 中文"), hf.encode("second one 👋🏽!")
    texts = {"a": "", "b": ""}
    for i in range(max(len(a), len(b))):
        rids = [rid for rid, ids in (("a", a), ("b", b)) if i < len(ids)]
        chunks = [(a if rid == "a" else b)[i : i + 1] for rid in rids]
        reasons = [LENGTH if i == len(a if r == "a" else b) - 1 else None for r in rids]
        out = manager.detokenize(token_out(rids, chunks, reasons))
        assert out.rids == tuple(rids)
        for rid, text in zip(out.rids, out.output_strs, strict=True):
            texts[rid] += text
    assert texts == {"a": hf.decode(a), "b": hf.decode(b)}
    assert len(manager.detokenizer) == 0


def test_prompt_context_is_decoded_ahead_but_not_emitted(
    manager: DetokenizerManager, hf: PreTrainedTokenizerBase
) -> None:
    prompt, output = hf.encode("the prompt says"), hf.encode(" hello there")
    pieces, _ = stream(manager, output, 1, context=prompt[-5:])
    full = hf.decode(prompt[-5:] + output)
    assert "".join(pieces) == full[len(hf.decode(prompt[-5:])) :]


@pytest.mark.parametrize("size", [1, 3])
def test_a_stop_string_ends_the_text_and_becomes_the_finish_reason(
    manager: DetokenizerManager, hf: PreTrainedTokenizerBase, size: int
) -> None:
    ids = hf.encode(TEXT)
    pieces, reason = stream(manager, ids, size, stop=["stop", "never"])
    assert "".join(pieces) == TEXT[: TEXT.index("stop")]
    assert reason == FinishReason("stop", matched_str="stop")
    assert len(manager.detokenizer) == 0
    assert manager.matched_stops == {}


def test_no_stop_trim_keeps_the_stop_string(
    manager: DetokenizerManager, hf: PreTrainedTokenizerBase
) -> None:
    pieces, reason = stream(manager, hf.encode(TEXT), 2, stop=["stop"], no_stop_trim=True)
    assert "".join(pieces) == TEXT[: TEXT.index("stop") + len("stop")]
    assert reason == FinishReason("stop", matched_str="stop")


def test_text_held_back_for_a_possible_stop_string_comes_out_at_finish(
    manager: DetokenizerManager, hf: PreTrainedTokenizerBase
) -> None:
    text = "ends with the beginning of sto"
    pieces, reason = stream(manager, hf.encode(text), 1, stop=["stop"])
    assert not "".join(pieces[:-1]).endswith("sto")
    assert "".join(pieces) == text
    assert reason == LENGTH


def test_an_abort_frees_the_request_and_flushes_its_text(
    manager: DetokenizerManager, hf: PreTrainedTokenizerBase
) -> None:
    ids = hf.encode("partial sto")
    first = manager.detokenize(token_out(["r"], [ids], [None], stop=["stop"]))
    assert "r" in manager.detokenizer
    abort = FinishReason("abort", message="client gone")
    last = manager.detokenize(token_out(["r"], [[]], [abort], stop=["stop"]))
    assert first.output_strs[0] + last.output_strs[0] == "partial sto"
    assert last.finished_reasons == (abort,)
    assert len(manager.detokenizer) == 0


def test_counts_and_logprobs_pass_through(
    manager: DetokenizerManager, hf: PreTrainedTokenizerBase
) -> None:
    ids = hf.encode("some text")
    msg = token_out(["r"], [ids], [LENGTH], logprobs=True, context=[1, 2])
    out = manager.detokenize(msg)
    assert out.output_ids == msg.output_ids
    assert out.prompt_tokens == (2,)
    assert out.completion_tokens == (len(ids),)
    assert out.cached_tokens == (3,)
    assert out.output_logprobs == msg.output_logprobs
    assert out.output_top_logprobs == msg.output_top_logprobs
    assert out.input_token_logprobs == msg.input_token_logprobs
    assert out.input_top_logprobs == msg.input_top_logprobs


def test_the_stage_loop_detokenizes_forwards_replies_and_stops(
    staged: tuple[DetokenizerManager, RingNames], hf: PreTrainedTokenizerBase
) -> None:
    manager, rings = staged
    ids = hf.encode("through the rings")

    async def scenario() -> list[Message]:
        to_stage, from_stage = Sender(rings.detokenizer), Receiver(rings.tokenizer)
        task = asyncio.ensure_future(manager.event_loop())
        try:
            await to_stage.send(token_out(["r"], [ids], [LENGTH]))
            await to_stage.send(FlushCacheOut("f", False, "busy"))
            await to_stage.send(HealthCheckOut("h", True))
            await to_stage.send(ShutdownReq("s"))
            got = [await from_stage.recv() for _ in range(3)]
            await asyncio.wait_for(task, 30)
            return got
        finally:
            task.cancel()
            to_stage.close()
            from_stage.close()

    out, flushed, health = asyncio.run(scenario())
    assert isinstance(out, BatchStrOut)
    assert out.output_strs == ("through the rings",)
    assert flushed == FlushCacheOut("f", False, "busy")
    assert health == HealthCheckOut("h", True)
    assert len(manager.detokenizer) == 0


@pytest.mark.slow
def test_a_gguf_tokenizer_decodes_like_its_directory(smollm2: Path) -> None:
    gguf = smollm2_gguf()
    assert gguf is not None
    hf = AutoTokenizer.from_pretrained(smollm2)
    ids = hf.encode(TEXT)
    with make_manager(ServerArgs(model_path=str(gguf))) as (manager, _):
        pieces, _ = stream(manager, ids, 2)
        assert "".join(pieces) == hf.decode(ids, skip_special_tokens=True)
