"""Qwen3: the Llama architecture with RMSNorm on each query and key head before rotary."""

from __future__ import annotations

from srt.models.llama import LlamaAttention, LlamaForCausalLM
from srt.models.registry import register_model


class Qwen3Attention(LlamaAttention):
    qk_norm = True


@register_model("Qwen3ForCausalLM", model_types=("qwen3",))
class Qwen3ForCausalLM(LlamaForCausalLM):
    attention_cls = Qwen3Attention
