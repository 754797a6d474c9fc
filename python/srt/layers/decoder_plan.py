"""What a model states about its decoder layers for an executor that runs them whole: each
layer's norms and projections (the modules themselves, read when the executor builds), and the
attention shape they share. A model offers its plan (`decoder_plan()`); the model runner hands
it to an executor (`model_executor/cpu_decode.py`, the CPU decode step in one Rust call) and
puts that executor on each `ForwardBatch` (`layers_executor`), where the model's forward pass
asks it to run the layers before running them one by one. The model does not know which
executor it is, nor whether there is one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from srt.layers.forward_batch import ForwardBatch
    from srt.layers.layernorm import RMSNorm
    from srt.layers.linear import Linear
    from srt.layers.moe import MoePlan


@dataclass(frozen=True)
class DecoderLayerPlan:
    """A pre-norm decoder layer: `input_norm`, then attention through `qkv` (q, k, v heads
    concatenated), with per-head `q_norm` and `k_norm` where the model has them (Qwen3), then
    `o`; `post_norm`, then the feed-forward: the gated MLP through `gate_up` (gate, up) and
    `down`, or a mixture of such experts (`moe`; then `gate_up` and `down` are None).
    `layer_id` is the layer's index in the KV pool."""

    layer_id: int
    input_norm: RMSNorm
    qkv: Linear
    q_norm: RMSNorm | None
    k_norm: RMSNorm | None
    o: Linear
    post_norm: RMSNorm
    gate_up: Linear | None
    down: Linear | None
    moe: MoePlan | None = None


@dataclass(frozen=True)
class DecoderPlan:
    """The layers in order and the attention shape they share (`scale`: the scores' factor)."""

    heads: int
    kv_heads: int
    head_dim: int
    scale: float
    layers: tuple[DecoderLayerPlan, ...]


class LayersExecutor(Protocol):
    def run(
        self,
        rope: tuple[torch.Tensor, torch.Tensor],
        hidden: torch.Tensor,
        residual: torch.Tensor,
        forward_batch: ForwardBatch,
    ) -> bool:
        """Runs every layer on `hidden` (replaced in place by the last layer's output) and
        `residual` (updated in place) when it can run this pass; whether it did."""
        ...
