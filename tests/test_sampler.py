"""The batched sampler: each request's parameters act on its own row only."""

from __future__ import annotations

import math
from array import array

import pytest
import torch

from srt.forward_mode import ForwardMode
from srt.layers.sampler import LogitBias, SamplingRow, apply_bias_and_bans, sample
from srt.model_executor.sampling_info import SamplingStates, record_prompt_logprobs
from srt.model_executor.worker_batch import ModelWorkerBatch, PromptLogprobs, RequestSamplingSpec
from srt.sampling_params import SamplingParams

VOCAB = 50


def random_logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax_and_logprobs_are_raw() -> None:
    logits = random_logits(4)
    out = sample(logits, [SamplingRow(temperature=0.0, top_logprobs_num=3)] * 4)
    assert out.next_ids == logits.argmax(-1).tolist()
    raw = torch.log_softmax(logits, -1)
    for i, token in enumerate(out.next_ids):
        assert out.logprobs[i] == pytest.approx(float(raw[i, token]), abs=1e-6)
        best = raw[i].topk(3)
        assert [t for t, _ in out.top_logprobs[i]] == best.indices.tolist()
        assert [v for _, v in out.top_logprobs[i]] == pytest.approx(best.values.tolist())


def test_top_k_one_is_greedy_at_any_temperature() -> None:
    logits = random_logits(3)
    out = sample(logits, [SamplingRow(temperature=5.0, top_k=1)] * 3)
    assert out.next_ids == logits.argmax(-1).tolist()


def empirical(logits: torch.Tensor, row: SamplingRow, draws: int = 4000) -> torch.Tensor:
    out = sample(logits.expand(draws, -1).contiguous(), [row] * draws)
    return torch.bincount(torch.tensor(out.next_ids), minlength=logits.shape[1]).float() / draws


def test_temperature_sampling_follows_softmax() -> None:
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    freq = empirical(logits, SamplingRow(temperature=0.5))
    expected = torch.softmax(logits[0] / 0.5, -1)
    assert torch.allclose(freq, expected, atol=0.03)


@pytest.mark.parametrize(
    ("row", "allowed"),
    [
        (SamplingRow(top_k=2), {0, 1}),
        (SamplingRow(top_p=0.7), {0, 1}),  # p = .64, .24, .09, .03: .64 < .7 keeps token 1
        (SamplingRow(min_p=0.2), {0, 1}),  # .09 < .2 * .64
    ],
)
def test_filters_keep_only_allowed_tokens(row: SamplingRow, allowed: set[int]) -> None:
    torch.manual_seed(0)
    logits = torch.log(torch.tensor([[0.64, 0.24, 0.09, 0.03]]))
    freq = empirical(logits, row)
    assert {i for i, f in enumerate(freq.tolist()) if f > 0} == allowed


def test_banned_ids_and_logit_bias() -> None:
    logits = random_logits(2)
    best = logits.argmax(-1).tolist()
    bias = LogitBias.of([(7, 100.0)])
    rows = [SamplingRow(temperature=0.0, min_new_tokens=2, stop_token_ids=(best[0],)),
            SamplingRow(temperature=0.0, logit_bias=bias)]  # fmt: skip
    out = sample(logits, rows, [[1], []])
    assert out.next_ids[0] != best[0]  # banned: one output token, min_new_tokens 2
    assert out.next_ids[1] == 7
    assert sample(logits, rows, [[1, 2], []]).next_ids[0] == best[0]  # min_new_tokens are out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_vectorized_logit_bias_equals_adding_each_entry(device: str) -> None:
    """Every row's bias in one indexed accumulation: the same as adding entry by entry, repeated
    ids adding up, rows without bias untouched, bans applied after the bias."""
    gen = torch.Generator().manual_seed(1)
    pairs = []
    for entries in (300, 0, 1, 40):
        ids = torch.randint(0, VOCAB, (entries,), generator=gen).tolist()  # repeats included
        values = (torch.rand(entries, generator=gen) * 200 - 100).tolist()
        pairs.append(list(zip(ids, values, strict=True)))
    rows = [SamplingRow(logit_bias=LogitBias.of(p)) for p in pairs]
    rows.append(SamplingRow(logit_bias=LogitBias.of([(3, 5.0)])))
    logits = random_logits(len(rows)).to(device)
    expected = logits.clone()
    for i, row_pairs in enumerate([*pairs, [(3, 5.0)]]):
        for token, bias in row_pairs:
            expected[i, token] += bias
    expected[4, [3, 4]] = float("-inf")
    out = apply_bias_and_bans(logits, rows, [(), (), (), (), (3, 4)])
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-4)
    assert out.device == logits.device
    assert not torch.equal(out, logits)  # a copy: the caller's logits keep the raw values


def test_penalties() -> None:
    logits = torch.tensor([[3.0, 2.9, -1.0, 0.0]])
    # Repetition penalty divides positive and multiplies negative logits of seen tokens.
    out = sample(logits, [SamplingRow(temperature=0.0, repetition_penalty=2.0, prompt_ids=(0,))])
    assert out.next_ids == [1]
    # Frequency: 0.06 per occurrence; presence: a flat 0.2 once seen.
    out = sample(logits, [SamplingRow(temperature=0.0, frequency_penalty=0.06)], [(0, 0)])
    assert out.next_ids == [1]
    out = sample(logits, [SamplingRow(temperature=0.0, frequency_penalty=0.04)], [(0, 0)])
    assert out.next_ids == [0]
    out = sample(logits, [SamplingRow(temperature=0.0, presence_penalty=0.2)], [(0,)])
    assert out.next_ids == [1]


def seeded_tokens(seed: int, batch_mates: int, steps: int = 20) -> list[int]:
    row = SamplingRow(temperature=1.0, generator=torch.Generator().manual_seed(seed))
    tokens = []
    for step in range(steps):
        own = random_logits(1, seed=step)
        mates = random_logits(batch_mates, seed=1000 + step)
        rows = [SamplingRow(temperature=1.0)] * batch_mates
        tokens.append(sample(torch.cat([mates, own]), [*rows, row]).next_ids[-1])
    return tokens


def test_seed_reproducible_whatever_the_batch() -> None:
    alone = seeded_tokens(1234, batch_mates=0)
    assert seeded_tokens(1234, batch_mates=5) == alone
    assert seeded_tokens(1234, batch_mates=2) == alone
    assert seeded_tokens(99, batch_mates=0) != alone


@pytest.mark.parametrize("temperature", [0.0, 1e-6, 1.0, 1e6])
def test_never_nan(temperature: float) -> None:
    logits = torch.tensor(
        [[math.nan, 1.0, 2.0], [-math.inf, -math.inf, -math.inf], [1e30, -1e30, 0.0]]
    )
    rows = [SamplingRow(temperature=temperature, top_p=0.5, top_k=2, min_p=0.1)] * 3
    out = sample(logits, rows)
    assert all(0 <= t < 3 for t in out.next_ids)
    assert out.next_ids[0] != 0  # the NaN logit is never chosen
    assert not any(math.isnan(v) for v in out.logprobs[::2])
    banning = SamplingRow(temperature=1.0, min_new_tokens=1, stop_token_ids=(0, 1, 2))
    all_banned = sample(logits[:1], [banning])
    assert 0 <= all_banned.next_ids[0] < 3


def test_rejects_mismatched_rows() -> None:
    with pytest.raises(ValueError, match="rows"):
        sample(random_logits(2), [SamplingRow()])
    with pytest.raises(ValueError, match="output histories"):
        sample(random_logits(1), [SamplingRow()], [(), ()])


# ---- the runner's per-request sampling state ----------------------------------------------------


def spec(**params: object) -> RequestSamplingSpec:
    """A request whose stop token is 0, with prompt [1, 2]."""
    return RequestSamplingSpec(
        params=SamplingParams(**params),  # type: ignore[arg-type]
        stop_token_ids=frozenset({0}),
        prompt_ids=(1, 2),
        top_logprobs_num=0,
    )


def decode_batch(rids: list[str], sample: list[bool] | None = None) -> ModelWorkerBatch:
    n = len(rids)
    return ModelWorkerBatch(
        forward_mode=ForwardMode.DECODE,
        rids=rids,
        rows=list(range(n)),
        seq_lens=[3] * n,
        extend_lens=[1] * n,
        input_ids=[7] * n,
        out_cache_loc=array("i", range(1, n + 1)),
        row_writes=[],
        sample=sample,
    )


def test_the_state_built_at_admission_carries_the_history_across_steps() -> None:
    """Settings are built once; each step's penalties and bans read the tokens the runner itself
    sampled for the request, and a step that does not sample it (a prompt chunk) changes none."""
    states = SamplingStates()
    states.add("freq", spec(temperature=0.0, frequency_penalty=0.06))
    states.add("min", spec(temperature=0.0, min_new_tokens=2))
    states.add("rep", spec(temperature=0.0, repetition_penalty=2.0))
    logits = torch.tensor([[3.0, 2.9, 2.8, -1.0]] * 3)
    steps = [states.sample(decode_batch(["freq", "min", "rep"]), logits) for _ in range(3)]
    # freq: 3.0 - 0.06 * count(0) passes below 2.9 after two 0s; min: 0 (the stop id) is banned
    # until two tokens are out; rep: prompt ids 1 and 2 are halved, so 0 wins throughout.
    assert [s.next_ids for s in steps] == [[0, 1, 0], [0, 1, 0], [1, 0, 0]]
    skipped = states.sample(decode_batch(["freq", "min"], sample=[False, True]), logits[:2])
    assert skipped.next_ids == [0]
    assert states.states["freq"].output_ids == [0, 0, 1]
    with pytest.raises(ValueError, match="already has sampling state"):
        states.add("freq", spec())
    states.remove("freq")
    states.remove("freq")  # unknown ids are ignored
    assert sorted(states.states) == ["min", "rep"]
    assert states.states["rep"].row.prompt_ids == (1, 2)
    assert states.states["min"].row.prompt_ids == ()  # kept only for a repetition penalty


def test_prompt_logprobs_come_from_each_sequences_rows() -> None:
    logits = random_logits(5)
    asked = [PromptLogprobs(first_row=1, target_ids=[4, 9]), None]
    logprobs, tops = record_prompt_logprobs(logits, [3, 2], asked, [2, 0])
    raw = torch.log_softmax(logits, -1)
    assert logprobs[0] == pytest.approx([float(raw[1, 4]), float(raw[2, 9])], abs=1e-6)
    assert [[t for t, _ in top] for top in tops[0]] == raw[1:3].topk(2).indices.tolist()
    assert (logprobs[1], tops[1]) == ([], [])
