"""The incremental detokenizer against Hugging Face decoding.

The reference for text is `transformers`' `tokenizer.decode(all_ids, skip_special_tokens=...,
spaces_between_special_tokens=...)` (stop strings: `test_detokenizer_manager.py`).
"""

from __future__ import annotations

import ast
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from srt import _rust
from srt.managers.incremental_detokenizer import PROMPT_CONTEXT_TOKENS, IncrementalDetokenizer

REPLACEMENT = "\ufffd"
TOOL = "<tool>"  # a non-special added token, which skip_special_tokens keeps
TEXTS = {
    "emoji": "Hi 👋🏽 family 👨‍👩‍👧 ok 🎉",
    "cjk": "中文字符 and 日本語のテキスト, 한국어",
    "combining": "e\u0301le\u0300ve, n\u0303o, a\u0308\u0304, Z\u0351\u0362a\u0336",
}


@pytest.fixture(scope="module")
def model_dir(
    tiny_model_factory: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The fixture byte-level tokenizer plus one non-special added token."""
    hf = AutoTokenizer.from_pretrained(tiny_model_factory("qwen2"))
    hf.add_tokens([TOOL])
    out = tmp_path_factory.mktemp("detok-tokenizer")
    hf.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture
def detok(model_dir: Path) -> IncrementalDetokenizer:
    return IncrementalDetokenizer(model_dir)


def run(
    detok: IncrementalDetokenizer, rid: str, ids: Sequence[int], sizes: Sequence[int] = (1,)
) -> list[str]:
    """Steps `ids` in chunks whose sizes cycle through `sizes`, then finishes and frees `rid`.
    Returns every piece emitted (finish's last)."""
    pieces: list[str] = []
    start = 0
    turn = 0
    while start < len(ids):
        size = sizes[turn % len(sizes)]
        pieces.append(detok.step(rid, ids[start : start + size]))
        start += size
        turn += 1
    pieces.append(detok.finish(rid))
    detok.free(rid)
    return pieces


def hf_decode(
    hf: PreTrainedTokenizerBase, ids: Sequence[int], skip: bool = False, spaces: bool = True
) -> str:
    """transformers' decode of one sequence with both flags."""
    text = hf.decode(list(ids), skip_special_tokens=skip, spaces_between_special_tokens=spaces)
    assert isinstance(text, str)
    return text


def assert_pieces_match(pieces: list[str], reference: str) -> None:
    """The pieces concatenate to `reference`, and a piece holds U+FFFD only where it does."""
    assert "".join(pieces) == reference
    offset = 0
    for piece in pieces:
        for i, char in enumerate(piece):
            if char == REPLACEMENT:
                assert reference[offset + i] == REPLACEMENT
        offset += len(piece)


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_multibyte_text_is_emitted_in_whole_characters(
    name: str, detok: IncrementalDetokenizer, hf: PreTrainedTokenizerBase
) -> None:
    text = TEXTS[name]
    ids = hf.encode(text, add_special_tokens=False)
    detok.add_request("r")
    pieces = run(detok, "r", ids)
    reference = hf_decode(hf, ids)
    assert_pieces_match(pieces, reference)
    # The fixture normalizes to NFC; marks without a precomposed form stay combining.
    assert reference == unicodedata.normalize("NFC", text)
    assert REPLACEMENT not in reference
    # Characters really do split across tokens here: some step had to hold its bytes back.
    assert "" in pieces[:-1]


@pytest.mark.parametrize("skip_special_tokens", [True, False])
@pytest.mark.parametrize("spaces_between_special_tokens", [True, False])
def test_special_tokens_follow_hf_decode(
    skip_special_tokens: bool,
    spaces_between_special_tokens: bool,
    detok: IncrementalDetokenizer,
    hf: PreTrainedTokenizerBase,
) -> None:
    text = f"<s><|im_start|>user\nhi {TOOL}<tool> 中<|im_end|><|im_end|>\n</s><pad>x<|endoftext|>"
    ids = hf.encode(text, add_special_tokens=False)
    assert hf.convert_tokens_to_ids(TOOL) in ids
    # transformers ignores `spaces_between_special_tokens` here, and so does srt (it takes none).
    detok.add_request("r", skip_special_tokens=skip_special_tokens)
    pieces = run(detok, "r", ids)
    reference = hf_decode(hf, ids, skip_special_tokens, spaces_between_special_tokens)
    assert_pieces_match(pieces, reference)
    assert ("<|im_end|>" in reference) != skip_special_tokens
    assert TOOL in reference


def test_prompt_context_keeps_a_stripped_leading_space(tmp_path: Path) -> None:
    # A sentencepiece-style decoder strips the leading space of a sequence's first token only.
    vocab = {"<unk>": 0, "▁Hello": 1, "▁world": 2, "!": 3}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.decoder = decoders.Metaspace()
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    detok = IncrementalDetokenizer(path)
    detok.add_request("plain")
    assert "".join(run(detok, "plain", [2, 3])) == tokenizer.decode([2, 3]) == "world!"
    prompt = [0, 1, 1, 1, 1, 1, 1]  # longer than the context: only its tail is decoded
    detok.add_request("ctx", prompt_ids=prompt)
    context = prompt[-PROMPT_CONTEXT_TOKENS:]
    full = tokenizer.decode([*context, 2, 3])
    assert "".join(run(detok, "ctx", [2, 3])) == full[len(tokenizer.decode(context)) :]
    assert full.endswith(" world!")


@st.composite
def id_sequences(draw: st.DrawFn, vocab_size: int, encode: Callable[[str], list[int]]) -> list[int]:
    """Random ids, the encoding of random text, or both interleaved."""
    random_ids = st.lists(st.integers(0, vocab_size - 1), max_size=40)
    encoded = st.text(max_size=30).map(encode)
    parts = draw(st.lists(st.one_of(random_ids, encoded), min_size=1, max_size=4))
    return [i for part in parts for i in part]


def check_random_sequences(detok: IncrementalDetokenizer, hf: PreTrainedTokenizerBase) -> None:
    def encode(text: str) -> list[int]:
        return list(hf.encode(text, add_special_tokens=False))

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        ids=id_sequences(len(hf), encode),
        prompt=id_sequences(len(hf), encode),
        sizes=st.lists(st.integers(1, 6), min_size=1, max_size=5),
        skip=st.booleans(),
        spaces=st.booleans(),
    )
    def check(
        ids: list[int], prompt: list[int], sizes: list[int], skip: bool, spaces: bool
    ) -> None:
        # Byte-level decoding needs no context, so a prompt must not change the text.
        detok.add_request("r", prompt_ids=prompt, skip_special_tokens=skip)
        pieces = run(detok, "r", ids, sizes)
        assert_pieces_match(pieces, hf_decode(hf, ids, skip, spaces))

    check()


def test_random_id_sequences_equal_hf_decode(
    detok: IncrementalDetokenizer, hf: PreTrainedTokenizerBase
) -> None:
    check_random_sequences(detok, hf)
    assert len(detok) == 0


@pytest.mark.slow
def test_smollm2_random_id_sequences_equal_hf_decode(smollm2: Path) -> None:
    check_random_sequences(IncrementalDetokenizer(smollm2), AutoTokenizer.from_pretrained(smollm2))


def test_a_lead_byte_forever_comes_out_as_it_is_generated(
    detok: IncrementalDetokenizer, hf: PreTrainedTokenizerBase
) -> None:
    # A logit_bias can force one token forever. Byte 0xE4 (GPT-2's byte character "ä") begins
    # a 3-byte character, so a run of it never becomes UTF-8: each is a U+FFFD, and must come
    # out as it is generated, not be held (and re-decoded at every step) until the request ends.
    lead = hf.convert_tokens_to_ids("\u00e4")
    assert isinstance(lead, int)
    assert hf_decode(hf, [lead]) == REPLACEMENT
    detok.add_request("r")
    streamed = "".join(detok.step("r", [lead]) for _ in range(10_000))
    held = detok.finish("r")
    detok.free("r")
    assert streamed + held == hf_decode(hf, [lead] * 10_000) == REPLACEMENT * 10_000
    assert len(held) <= 4, "the window holds a few tokens at most, not the stream"


SENTENCE = "The quick brown fox jumps over the lazy dog. 狐狸跳过了懒狗 🦊!"


def test_batched_step_equals_sequential_steps(model_dir: Path, hf: PreTrainedTokenizerBase) -> None:
    batched, single = IncrementalDetokenizer(model_dir), IncrementalDetokenizer(model_dir)
    texts = [*TEXTS.values(), SENTENCE, "<|im_start|>a<|im_end|> 🦊"]
    streams = {f"r{i}": hf.encode(t, add_special_tokens=False) for i, t in enumerate(texts)}
    for detok in (batched, single):
        for i, rid in enumerate(streams):
            detok.add_request(rid, skip_special_tokens=i % 2 == 0)
    for position in range(max(map(len, streams.values()))):
        rids = [rid for rid, ids in streams.items() if position < len(ids)]
        new_ids = [streams[rid][position : position + 1] for rid in rids]
        assert batched.step_batch(rids, new_ids) == [
            single.step(rid, ids) for rid, ids in zip(rids, new_ids, strict=True)
        ]
    assert [batched.finish(rid) for rid in streams] == [single.finish(rid) for rid in streams]


def test_unknown_and_duplicate_requests_raise(
    detok: IncrementalDetokenizer, hf: PreTrainedTokenizerBase
) -> None:
    x, y = hf.encode("x"), hf.encode("y")
    detok.add_request("a")
    with pytest.raises(ValueError, match="already"):
        detok.add_request("a")
    for call in (lambda: detok.step("b", [1]), lambda: detok.finish("b"), lambda: detok.free("b")):
        with pytest.raises(ValueError, match="not in the detokenizer"):
            call()
    # An unknown request anywhere in a batch leaves every request as it was.
    with pytest.raises(ValueError, match="not in the detokenizer"):
        detok.step_batch(["a", "b"], [x, [1]])
    assert detok.step_batch(["a"], [y]) == ["y"]
    with pytest.raises(ValueError, match="id lists"):
        detok.step_batch(["a"], [])
    assert "a" in detok
    assert "b" not in detok
    assert len(detok) == 1
    detok.free("a")
    assert len(detok) == 0
    with pytest.raises(ValueError, match="cannot load tokenizer"):
        IncrementalDetokenizer("/nonexistent/tokenizer.json")


def test_stub_lists_the_binding() -> None:
    stub = ast.parse((Path(_rust.__file__).parent / "_rust.pyi").read_text())
    [cls] = [
        n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "IncrementalDetokenizer"
    ]
    stubbed = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    public = {n for n in dir(_rust.IncrementalDetokenizer) if not n.startswith("_")}
    assert public <= stubbed
    assert all(hasattr(_rust.IncrementalDetokenizer, name) for name in stubbed)
