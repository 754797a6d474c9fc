"""Driving a ModelRunner by hand in tests: a stand-in for the scheduler's bookkeeping."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from srt.model_executor.model_runner import ModelRunner
from srt.server_args import ServerArgs

# Where device-level tests (kernels, attention backends) run: the GPU when there is one.
TEST_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class TinyModelFactory(Protocol):
    """The `tiny_model_factory` fixture: the tiny model of an architecture, in the sizes of a
    `make_tiny_model` preset."""

    def __call__(self, arch: str, preset: str = "tiny") -> Path: ...


def make_runner(path: Path | str, **overrides: object) -> ModelRunner:
    settings: dict[str, object] = {
        "device": "cpu",
        "dtype": "float32",
        "max_total_tokens": 4096,
        "max_running_requests": 16,
        "attention_backend": "cpu",
    }
    settings.update(overrides)
    return ModelRunner(ServerArgs(**settings), str(path))  # type: ignore[arg-type]


class SlotBook:
    """Hands out fresh KV slots (never slot 0) in order; enough for a test's few sequences."""

    def __init__(self, runner: ModelRunner) -> None:
        self.next_slot = 1
        self.limit = runner.max_total_tokens

    def take(self, n: int) -> list[int]:
        assert self.next_slot + n <= self.limit + 1, "test ran out of KV slots"
        slots = list(range(self.next_slot, self.next_slot + n))
        self.next_slot += n
        return slots


def take_rows(runner: ModelRunner, n: int) -> list[int]:
    """The first `n` request rows of the runner's pool (a test drives one sequence per row)."""
    assert n <= runner.req_to_token_pool.size, "test ran out of request rows"
    return list(range(n))


def extend_and_decode_logits(path: Path, **overrides: object) -> list[torch.Tensor]:
    """Logits (copied to the CPU) of: two prompts prefilled together, a third reusing the
    first's cached prefix, then three decode steps of all three, on TEST_DEVICE by default."""
    runner = make_runner(path, **{"max_total_tokens": 256, "device": TEST_DEVICE.type, **overrides})
    return runner_extend_and_decode_logits(runner)


def runner_extend_and_decode_logits(runner: ModelRunner) -> list[torch.Tensor]:
    """`extend_and_decode_logits` on a runner made elsewhere (fresh: no slot or row in use)."""
    book = SlotBook(runner)
    rows = take_rows(runner, 3)
    prompts = [[5, 17, 42, 99, 7, 300, 12], [8, 9, 10]]
    batches = [runner.prepare_extend(rows[:2], [0, 0], prompts, book.take(10))]
    outputs = [runner.forward(batches[0]).cpu()]
    shared = 4
    runner.req_to_token_pool.write(
        rows[2], 0, runner.req_to_token_pool.req_to_token[rows[0], :shared].clone()
    )
    batch = runner.prepare_extend([rows[2]], [shared], [[61, 62, 63]], book.take(3))
    outputs.append(runner.forward(batch).cpu())
    seq_lens = [7, 3, 7]
    for step in range(3):
        seq_lens = [n + 1 for n in seq_lens]
        batch = runner.prepare_decode(rows, seq_lens, [20 + step] * 3, book.take(3))
        outputs.append(runner.forward(batch).cpu())
    return outputs


def assert_logits_close(
    ours: list[torch.Tensor], theirs: list[torch.Tensor], rtol: float = 1e-3
) -> None:
    """Each step's logits within `rtol` of the reference's largest logit at that step (the
    quantized kernels' rounding of activations: about 2^-15 on tiles, float32's sums
    elsewhere)."""
    for mine, reference in zip(ours, theirs, strict=True):
        atol = rtol * float(reference.abs().max())
        torch.testing.assert_close(mine, reference, atol=atol, rtol=0)


def teacher_forced_logits(
    runner: ModelRunner, prompts: list[list[int]], tokens: list[list[int]]
) -> torch.Tensor:
    """Float32 logits `[steps, len(prompts), vocab]` of one extend of all prompts, then decode
    steps that feed each prompt its `tokens` (all of one length, `steps`) in turn, whatever the
    runner would have chosen: every step sees the same context as the run that chose them."""
    book = SlotBook(runner)
    rows = take_rows(runner, len(prompts))
    batch = runner.prepare_extend(
        rows, [0] * len(prompts), prompts, book.take(sum(len(p) for p in prompts))
    )
    seq_lens = [len(p) for p in prompts]
    logits = [runner.forward(batch).float().cpu()]
    for step in range(len(tokens[0]) - 1):
        seq_lens = [n + 1 for n in seq_lens]
        fed = [t[step] for t in tokens]
        batch = runner.prepare_decode(rows, seq_lens, fed, book.take(len(rows)))
        logits.append(runner.forward(batch).float().cpu())
    return torch.stack(logits)


def next_token_fidelity(ours: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    """Top-1 agreement and mean KL(reference || ours) of log-probabilities `[..., vocab]`."""
    kl = (reference.exp() * (reference - ours)).sum(-1)
    same_top = (ours.argmax(-1) == reference.argmax(-1)).float().mean()
    return float(same_top), float(kl.mean())


def greedy_generate(
    runner: ModelRunner, prompts: list[list[int]], max_new_tokens: int, banned: set[int]
) -> list[list[int]]:
    """Greedy decoding of several prompts in one batch: one extend, then decode steps.
    Token ids in `banned` are never chosen (as transformers' min_new_tokens does for EOS)."""
    book = SlotBook(runner)
    rows = take_rows(runner, len(prompts))
    batch = runner.prepare_extend(
        rows, [0] * len(prompts), prompts, book.take(sum(len(p) for p in prompts))
    )
    outputs: list[list[int]] = [[] for _ in prompts]
    seq_lens = [len(p) for p in prompts]
    for step in range(max_new_tokens):
        logits = runner.forward(batch)
        if banned:
            logits = logits.index_fill(1, torch.tensor(sorted(banned)), float("-inf"))
        next_ids = logits.argmax(dim=-1).tolist()
        for out, token in zip(outputs, next_ids, strict=True):
            out.append(token)
        if step + 1 == max_new_tokens:
            break
        seq_lens = [n + 1 for n in seq_lens]
        batch = runner.prepare_decode(rows, seq_lens, next_ids, book.take(len(rows)))
    return outputs
