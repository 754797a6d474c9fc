"""Qwen2: the Llama architecture with biases on the q/k/v projections."""

from __future__ import annotations

from srt.models.llama import LlamaAttention, LlamaForCausalLM
from srt.models.registry import register_model


class Qwen2Attention(LlamaAttention):
    qkv_bias = True


@register_model("Qwen2ForCausalLM", model_types=("qwen2",))
class Qwen2ForCausalLM(LlamaForCausalLM):
    attention_cls = Qwen2Attention
