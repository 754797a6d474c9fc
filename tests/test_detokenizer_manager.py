"""The detokenizer stage: streamed text against Hugging Face decoding, the cut at the stop string
the scheduler found, the life of each request's state, and the stage's loop on real rings."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from srt.io_struct import (
    BatchStrOut,
    BatchTokenIDOut,
    DetokenizeSettings,
    FinishReason,
    FlushCacheOut,
    HealthCheckOut,
    Message,
    ShutdownReq,
    TokenizedGenerateReq,
)
from srt.ipc.channel import Receiver, Sender
from srt.ipc.rings import RingNames
from srt.managers.detokenizer_manager import DetokenizerManager
from srt.managers.schedule_batch import Req, make_output
from srt.managers.stop_strings import StopStringChecker
from srt.sampling_params import SamplingParams
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
    first: bool = True,
) -> BatchTokenIDOut:
    """A message for `rids`; with `first`, it carries their settings (the first message)."""
    n = len(rids)
    settings = DetokenizeSettings(tuple(context), True, no_stop_trim, tuple(stop))
    return BatchTokenIDOut(
        rids=tuple(rids),
        output_ids=tuple(tuple(x) for x in ids),
        finished_reasons=tuple(reasons),
        prompt_tokens=(len(context),) * n,
        completion_tokens=tuple(len(x) for x in ids),
        cached_tokens=(3,) * n,
        settings=(settings if first else None,) * n,
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
        reason = final if last else None
        msg = token_out(["r"], [chunk], [reason], first=start == 0, **options)  # type: ignore[arg-type]
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
    assert manager.stop_texts == {}


def test_requests_interleave_within_batches(
    manager: DetokenizerManager, hf: PreTrainedTokenizerBase
) -> None:
    a, b = hf.encode("first request 中文"), hf.encode("second one 👋🏽!")
    texts = {"a": "", "b": ""}
    for i in range(max(len(a), len(b))):
        rids = [rid for rid, ids in (("a", a), ("b", b)) if i < len(ids)]
        chunks = [(a if rid == "a" else b)[i : i + 1] for rid in rids]
        reasons = [LENGTH if i == len(a if r == "a" else b) - 1 else None for r in rids]
        out = manager.detokenize(token_out(rids, chunks, reasons, first=i == 0))
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


def through_stop(hf: PreTrainedTokenizerBase, text: str, offset: int, stop: str) -> list[int]:
    """The ids of `text` up to the token that completes `stop` at `offset` (where the scheduler
    ends the request)."""
    ids = hf.encode(text)
    n = next(n for n in range(len(ids)) if len(hf.decode(ids[:n])) >= offset + len(stop))
    return ids[:n]


@pytest.mark.parametrize("size", [1, 3])
@pytest.mark.parametrize("no_stop_trim", [False, True])
def test_the_text_ends_where_the_scheduler_found_the_stop_string(
    manager: DetokenizerManager, hf: PreTrainedTokenizerBase, size: int, no_stop_trim: bool
) -> None:
    # The scheduler found the second "stop" (the first came before `min_new_tokens`): the cut
    # is there, not at the first occurrence, and the first streams out.
    text = "stop early, then stop here, then more"
    offset = text.index("stop", 1)
    reason = FinishReason("stop", matched_str="stop", matched_offset=offset)
    ids = through_stop(hf, text, offset, "stop")
    pieces, got = stream(
        manager, ids, size, final=reason, stop=["stop", "never"], no_stop_trim=no_stop_trim
    )
    assert "".join(pieces) == text[: offset + (len("stop") if no_stop_trim else 0)]
    assert got == reason
    if not no_stop_trim:  # a stream never shows what the cut removes
        assert all("stop here" not in "".join(pieces[:k]) for k in range(len(pieces)))
    assert len(manager.detokenizer) == 0
    assert manager.stop_texts == {}


def generate_through_both(
    manager: DetokenizerManager,
    checker: StopStringChecker,
    ids: Sequence[int],
    params: SamplingParams,
    sizes: Sequence[int],
) -> tuple[str, list[str], FinishReason | None]:
    """Plays the scheduler's part for a request whose model outputs `ids` (its stop-string
    checker and `make_output`, messages of `sizes` ids in turn) through the detokenizer; returns
    the text, its pieces and the finish reason."""
    req = Req(TokenizedGenerateReq("r", (1, 2, 3), params), frozenset())
    assert checker.add(req) is None
    pieces: list[str] = []
    for n, token in enumerate(ids, 1):
        req.output_ids.append(token)
        checker.check(req)
        if n == len(ids) and not req.finished():
            req.finished_reason = LENGTH
        if req.finished() or n - req.sent_len == sizes[len(pieces) % len(sizes)]:
            out = manager.detokenize(make_output([req]))
            req.sent_len, req.settings_sent = n, True
            pieces.append(out.output_strs[0])
        if req.finished():
            checker.forget(req)
            break
    assert len(manager.detokenizer) == 0
    assert manager.stop_texts == {}
    return "".join(pieces), pieces, req.finished_reason


def expected_stop(
    text: str, stops: Sequence[str], keep: bool, after: int = 0
) -> tuple[str, str | None]:
    """Reference model: of the stop-string occurrences that end past `after` characters (the text
    before `min_new_tokens`), the one that ends first (ties: the longest) ends the text."""
    found = [
        (start + len(stop), start, stop)
        for stop in stops
        for start in range(len(text))
        if text.startswith(stop, start) and start + len(stop) > after
    ]
    if not found:
        return text, None
    end, start, stop = min(found)
    return text[: end if keep else start], stop


SENTENCE = "The quick brown fox jumps over the lazy dog. 狐狸跳过了懒狗 🦊!"


@pytest.mark.parametrize(
    ("stops", "keep", "expected", "matched"),
    [
        (["fox ju"], False, "The quick brown ", "fox ju"),
        (["fox ju"], True, "The quick brown fox ju", "fox ju"),
        (["own fox", "brown f"], False, "The quick ", "brown f"),  # overlapping: ends first
        (["lazy dog", "lazy"], False, "The quick brown fox jumps over the ", "lazy"),  # prefix
        (["跳过", "狸跳"], True, "The quick brown fox jumps over the lazy dog. 狐狸跳", "狸跳"),
        (["🦊!"], False, "The quick brown fox jumps over the lazy dog. 狐狸跳过了懒狗 ", "🦊!"),
        (["fox jumps under", "🦊?"], False, SENTENCE, None),  # never complete: all comes out
    ],
)
def test_the_scheduler_finds_and_the_detokenizer_cuts(
    manager: DetokenizerManager,
    model_dir: Path,
    hf: PreTrainedTokenizerBase,
    stops: list[str],
    keep: bool,
    expected: str,
    matched: str | None,
) -> None:
    assert expected_stop(SENTENCE, stops, keep) == (expected, matched)
    ids = hf.encode(SENTENCE, add_special_tokens=False)
    params = SamplingParams(max_new_tokens=len(ids), stop=tuple(stops), no_stop_trim=keep)
    checker = StopStringChecker(str(model_dir))
    for sizes in ([1], [2, 3], [len(ids)]):
        text, pieces, reason = generate_through_both(manager, checker, ids, params, sizes)
        assert text == expected
        assert reason == (
            LENGTH if matched is None else FinishReason("stop", matched_str=matched,
                                                        matched_offset=SENTENCE.index(matched))
        )  # fmt: skip
        if matched is not None and not keep:  # a stream never shows what the cut removes
            assert all(matched not in "".join(pieces[:k]) for k in range(len(pieces) + 1))


def test_stop_strings_against_the_reference_model(
    manager: DetokenizerManager, model_dir: Path, hf: PreTrainedTokenizerBase
) -> None:
    checker = StopStringChecker(str(model_dir))
    alphabet = st.sampled_from(
        [*"ab c", "ab", "b a", "cc"]
    )  # ASCII: each token ends whole characters
    text_st = st.lists(alphabet, min_size=1, max_size=25).map("".join)
    stop_st = st.lists(alphabet, min_size=1, max_size=3).map("".join)

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        text=text_st,
        stops=st.lists(stop_st, min_size=1, max_size=4),
        keep=st.booleans(),
        sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4),
        min_new_tokens=st.integers(0, 30),
    )
    def check(
        text: str, stops: list[str], keep: bool, sizes: list[int], min_new_tokens: int
    ) -> None:
        ids = hf.encode(text, add_special_tokens=False)
        min_new_tokens = min(min_new_tokens, len(ids))
        params = SamplingParams(
            max_new_tokens=len(ids),
            min_new_tokens=min_new_tokens,
            stop=tuple(stops),
            no_stop_trim=keep,
        )
        before = len(hf.decode(ids[: max(min_new_tokens - 1, 0)]))
        got, _, reason = generate_through_both(manager, checker, ids, params, sizes)
        want, matched = expected_stop(text, stops, keep, after=before)
        assert (got, None if reason is None else reason.matched_str) == (want, matched)

    check()


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
    last = manager.detokenize(token_out(["r"], [[]], [abort], stop=["stop"], first=False))
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
