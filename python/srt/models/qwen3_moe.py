"""Qwen3-MoE (Qwen3-30B-A3B and its kin): Qwen3's attention (RMSNorm on each query and key head)
with a sparse mixture of experts in place of the MLP (`layers/moe.py`): a router picks each
token's `num_experts_per_tok` of `num_experts` gated-MLP experts of `moe_intermediate_size`
rows, weighted by their softmax probabilities, renormalized over the chosen ones when
`norm_topk_prob`. Layers listed in `mlp_only_layers`, and all but every `decoder_sparse_step`-th
one, keep the dense MLP of `intermediate_size` rows.

The checkpoint names each expert's projections (`mlp.experts.E.gate_proj`, ...) and the router
(`mlp.gate`); each expert is a `LlamaMLP` whose gate/up projections are fused as the dense
MLP's are. A GGUF file stacks the experts of a layer into one 3-D tensor per projection
(`ffn_gate_exps`, ...), which the weight loader cuts into the experts' tensors; llama.cpp keeps
the router (`ffn_gate_inp`) in float32.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from srt.layers.moe import SparseMoeBlock
from srt.models.llama import GGUF_LAYER_NAMES as LLAMA_GGUF_LAYER_NAMES
from srt.models.llama import LlamaForCausalLM, LlamaMLP
from srt.models.qwen3 import Qwen3Attention
from srt.models.registry import register_model

# `{expert}`: a 3-D tensor of every expert, cut into one tensor per expert as it loads.
GGUF_LAYER_NAMES = {
    **LLAMA_GGUF_LAYER_NAMES,
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.{expert}.gate_proj",
    "ffn_up_exps": "mlp.experts.{expert}.up_proj",
    "ffn_down_exps": "mlp.experts.{expert}.down_proj",
}


def is_sparse(config: Any, layer_id: int) -> bool:
    """Whether layer `layer_id` has the mixture of experts (else the dense MLP)."""
    return (
        layer_id not in (getattr(config, "mlp_only_layers", None) or [])
        and config.num_experts > 0
        and (layer_id + 1) % config.decoder_sparse_step == 0
    )


@register_model("Qwen3MoeForCausalLM", model_types=("qwen3_moe",))
class Qwen3MoeForCausalLM(LlamaForCausalLM):
    attention_cls = Qwen3Attention
    gguf_layer_names = GGUF_LAYER_NAMES

    @classmethod
    def feed_forward(cls, config: Any, layer_id: int) -> nn.Module:
        if not is_sparse(config, layer_id):
            return LlamaMLP(config)
        return SparseMoeBlock(
            config.hidden_size,
            config.num_experts,
            config.num_experts_per_tok,
            bool(config.norm_topk_prob),
            lambda: LlamaMLP(config, config.moe_intermediate_size, reduce_results=False),
        )
