"""How far a forward pass is from the machine's limits: what the machine can do (copy
bandwidth, dense GEMM rate), measured in the same run as the model, and what a step of the
model must do (bytes of weights and KV cache it reads, useful FLOPs it computes).

The work is counted from the model as loaded, so the bytes follow the dtype it runs in, and a
quantized weight (a layer's `quant`: GGUF blocks, int8 rows) counts the bytes it holds
(`nbytes`), which is what its product reads. What counts, and why:
- every weight of a layer other than an embedding is read in full by every forward pass
  (projections, norms, the lm_head);
- an embedding table is read one row per token, so at decode `batch` rows of it, unless the
  lm_head shares it (tied embeddings), which reads it in full: one parameter, counted once;
- FLOPs are the useful ones: 2 per weight of a projection per token, the lm_head for each
  sequence's last token only (the one whose logits are sampled), and causal attention (each
  query against itself and the keys before it: 2 multiply-adds per head dimension for QK^T and
  for PV). Biases, norms, activations and rotary are noise beside these and are left out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, result


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 28) -> float:
    """Bytes per second moved (read plus written) by a large tensor copy on `device`."""
    source = torch.empty(nbytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    seconds = min(timed(partial(target.copy_, source), device)[0] for _ in range(5))
    return 2 * nbytes / seconds


def gemm_rate(
    dtype: torch.dtype, device: torch.device, max_s: float = 1.0, max_n: int = 8192
) -> float:
    """FLOP/s of a warm square `torch.matmul` in `dtype`, the best of three at the best size.

    Small products are dominated by thread start-up (all the more on a loaded machine), so the
    size doubles from 512 while the rate still grows by a tenth, and stops before one product
    would take over `max_s`: a dtype the CPU only emulates still finishes in seconds."""
    n, best_rate = 512, 0.0
    while True:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        torch.matmul(a, b)
        seconds = min(timed(partial(torch.matmul, a, b), device)[0] for _ in range(3))
        rate = 2 * n**3 / seconds
        grew = rate > 1.1 * best_rate
        best_rate = max(best_rate, rate)
        if not grew or seconds * 8 > max_s or n >= max_n:
            return best_rate
        n *= 2


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _weights_of(module: nn.Module) -> list[tuple[int, int, int]]:
    """(identity, bytes, rows) of each weight `module` holds itself: its parameters, and its
    quantized weight (`quant`) if it has one."""
    weights = [
        (id(p), _nbytes(p), p.shape[0] if p.dim() else 1) for p in module.parameters(recurse=False)
    ]
    quant = getattr(module, "quant", None)
    if quant is not None:
        weights.append((id(quant), int(quant.nbytes), int(quant.out_features)))
    return weights


def decode_weight_bytes(model: nn.Module, batch_size: int) -> int:
    """Bytes of weights a decode step of `batch_size` sequences reads (see the module doc)."""
    streamed: dict[int, int] = {}
    gathered: dict[int, tuple[int, int]] = {}
    for module in model.modules():
        for key, nbytes, rows in _weights_of(module):
            if isinstance(module, nn.Embedding):
                gathered[key] = (nbytes, rows)
            else:
                streamed[key] = nbytes
    total = sum(streamed.values())
    for key, (nbytes, rows) in gathered.items():
        if key not in streamed:
            total += min(batch_size, rows) * nbytes // rows
    return total


def linear_params(model: nn.Module) -> tuple[int, int]:
    """(weights of the projections every token goes through, weights of the lm_head)."""
    lm_head = getattr(model, "lm_head", None)
    per_token = sum(
        module.in_features * module.out_features
        for module in model.modules()
        if isinstance(module, nn.Linear) and module is not lm_head
    )
    if not isinstance(lm_head, nn.Linear):
        return per_token, 0
    return per_token, lm_head.in_features * lm_head.out_features


def attention_flops(
    num_layers: int, num_heads: int, head_dim: int, query_context: list[int]
) -> int:
    """QK^T and PV over every layer and head, for queries that each see `query_context[i]`
    keys (itself included)."""
    return 4 * num_layers * num_heads * head_dim * sum(query_context)


def prefill_flops(
    per_token_params: int,
    lm_head_params: int,
    num_layers: int,
    num_heads: int,
    head_dim: int,
    batch_size: int,
    input_len: int,
) -> int:
    """Useful FLOPs of a prefill of `batch_size` fresh prompts of `input_len` tokens."""
    causal = [i + 1 for i in range(input_len)]
    return batch_size * (
        2 * per_token_params * input_len
        + 2 * lm_head_params
        + attention_flops(num_layers, num_heads, head_dim, causal)
    )


def decode_flops(
    per_token_params: int,
    lm_head_params: int,
    num_layers: int,
    num_heads: int,
    head_dim: int,
    batch_size: int,
    context: int,
) -> int:
    """Useful FLOPs of a decode step of `batch_size` sequences of `context` tokens each."""
    return batch_size * (
        2 * (per_token_params + lm_head_params)
        + attention_flops(num_layers, num_heads, head_dim, [context])
    )
