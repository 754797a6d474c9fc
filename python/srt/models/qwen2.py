"""Qwen2: the Llama architecture with biases on the q/k/v projections."""

from __future__ import annotations

from srt.models.llama import LlamaAttention, LlamaForCausalLM


class Qwen2Attention(LlamaAttention):
    qkv_bias = True


class Qwen2ForCausalLM(LlamaForCausalLM):
    attention_cls = Qwen2Attention
