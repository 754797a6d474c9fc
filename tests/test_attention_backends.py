"""Every attention backend gives the model the same logits as the torch_native reference,
through extend with a reused cached prefix and decode (Triton runs in its interpreter on CPU)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from runner_helpers import TEST_DEVICE, SlotBook, make_runner

from srt.layers.attention.registry import ATTENTION_BACKENDS
from srt.server_args import ATTENTION_BACKENDS as CLI_BACKENDS


def run_steps(path: Path, backend: str) -> list[torch.Tensor]:
    """Logits of: two prompts prefilled together, a third reusing the first's prefix, then
    three decode steps of all three."""
    runner = make_runner(
        path, attention_backend=backend, max_total_tokens=256, device=TEST_DEVICE.type
    )
    book = SlotBook(runner)
    rows = runner.req_to_token_pool.alloc(3)
    assert rows is not None
    prompts = [[5, 17, 42, 99, 7, 300, 12], [8, 9, 10]]
    outputs = [runner.forward(runner.prepare_extend(rows[:2], [0, 0], prompts, book.take(10)))]
    shared = 4
    runner.req_to_token_pool.write(
        rows[2], 0, runner.req_to_token_pool.req_to_token[rows[0], :shared].clone()
    )
    outputs.append(
        runner.forward(runner.prepare_extend([rows[2]], [shared], [[61, 62, 63]], book.take(3)))
    )
    seq_lens = [7, 3, 7]
    for step in range(3):
        seq_lens = [n + 1 for n in seq_lens]
        batch = runner.prepare_decode(rows, seq_lens, [20 + step] * 3, book.take(3))
        outputs.append(runner.forward(batch))
    return outputs


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_triton_matches_torch_native(arch: str, tiny_model_factory: Callable[[str], Path]) -> None:
    path = tiny_model_factory(arch)
    reference = run_steps(path, "torch_native")
    for ours, expected in zip(run_steps(path, "triton"), reference, strict=True):
        torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)


def test_registry_and_cli_agree() -> None:
    assert set(ATTENTION_BACKENDS) <= set(CLI_BACKENDS)
    assert set(CLI_BACKENDS) - set(ATTENTION_BACKENDS) == {"flashinfer"}


def test_flashinfer_is_refused_where_unavailable(tiny_model_factory: Callable[[str], Path]) -> None:
    with pytest.raises(ValueError, match="flashinfer"):
        make_runner(tiny_model_factory("llama"), attention_backend="flashinfer")
