"""The Llama family: Llama 2/3 (with Llama 3 rope scaling), Mistral, SmolLM; and the base of the
Qwen families, which differ in their attention projections (see qwen2.py, qwen3.py) and, for
Qwen3-MoE, in the feed-forward a layer has (`feed_forward`: qwen3_moe.py's mixture of experts).

Weights keep Hugging Face's names, except that q/k/v and gate/up projections are fused into one
matrix each (`qkv_proj`, `gate_up_proj`): `load_weights` stacks the checkpoint's shards into them,
float tensors by copying, GGUF blocks by concatenating their rows (models/loading.py).

Under tensor parallelism (srt.distributed) each rank builds its share: its attention heads (and
KV heads, replicated when fewer than the ranks), its share of the MLP's intermediate rows and of
the vocabulary (layers/parallel_linear.py); `load_weights` cuts each checkpoint tensor to the
rank's shard before it is copied.

The model states its layers (`decoder_plan`); an executor the model runner puts on the forward
batch (`layers_executor`) may run them all at once, else they run one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, cast

import torch
from torch import nn

from srt.distributed import get_tp_group
from srt.kernels.cpu.quant_kernels import QuantizedWeight
from srt.layers.activation import SiluAndMul
from srt.layers.decoder_plan import DecoderLayerPlan, DecoderPlan
from srt.layers.forward_batch import ForwardBatch
from srt.layers.layernorm import RMSNorm
from srt.layers.lazy_tensor import LazyTensor
from srt.layers.logits_processor import compute_logits
from srt.layers.moe import SparseMoeBlock
from srt.layers.parallel_linear import (
    ColumnParallelLinear,
    Loadable,
    ParallelLMHead,
    RowParallelLinear,
    heads_part,
    split_part,
)
from srt.layers.radix_attention import RadixAttention
from srt.layers.rotary_embedding import RotaryEmbedding, apply_rotary, rope_parameters
from srt.layers.vocab_embedding import VocabParallelEmbedding
from srt.models.loading import QuantizedShards, copy_checked, copy_shard
from srt.models.registry import register_model

Rope = tuple[torch.Tensor, torch.Tensor]  # cos and signed sin, see RotaryEmbedding.forward

# checkpoint name part -> (fused parameter name part, shard index)
STACKED_PARAMS = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}

# llama.cpp's names of a decoder layer's tensors in a GGUF file (`blk.N.<name>.weight`) ->
# the checkpoint's names under `model.layers.N.` (before q/k/v and gate/up are fused).
GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def head_dim_of(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class LlamaAttention(nn.Module):
    qkv_bias: bool = False  # Qwen2 sets this
    qk_norm: bool = False  # Qwen3 sets this

    def __init__(self, config: Any, layer_id: int) -> None:
        super().__init__()
        total_heads = config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        self.head_dim = head_dim_of(config)
        if total_heads % get_tp_group().size:
            raise ValueError(
                f"{total_heads} attention heads do not split evenly over "
                f"{get_tp_group().size} tensor-parallel ranks"
            )
        q_part = heads_part(total_heads, self.head_dim)
        kv_part = heads_part(total_kv_heads, self.head_dim)
        # This rank's heads.
        self.num_heads = q_part.rows // self.head_dim
        self.num_kv_heads = kv_part.rows // self.head_dim
        self.q_size = q_part.rows
        self.kv_size = kv_part.rows
        bias = getattr(config, "attention_bias", False)
        self.qkv_proj = ColumnParallelLinear(
            config.hidden_size, [q_part, kv_part, kv_part], bias=bias or self.qkv_bias
        )
        self.o_proj = RowParallelLinear(q_part.total, config.hidden_size, bias=bias)
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.attn = RadixAttention(
            self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads, layer_id
        )

    def forward(
        self, rope: Rope, hidden: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, rope), apply_rotary(k, rope)
        return self.o_proj(self.attn(q, k, v, forward_batch))


class LlamaMLP(nn.Module):
    """The gated MLP: `intermediate_size` rows (the config's unless given: a mixture's experts
    have their own), its output all-reduced over the ranks unless `reduce_results` is False."""

    def __init__(
        self, config: Any, intermediate_size: int | None = None, reduce_results: bool = True
    ) -> None:
        super().__init__()
        bias = getattr(config, "mlp_bias", False)
        intermediate = intermediate_size or config.intermediate_size
        part = split_part(intermediate)
        self.gate_up_proj = ColumnParallelLinear(config.hidden_size, [part, part], bias=bias)
        self.down_proj = RowParallelLinear(
            intermediate, config.hidden_size, bias=bias, reduce_results=reduce_results
        )
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


# Builds a decoder layer's feed-forward: (config, layer index) -> module.
FeedForward = Callable[[Any, int], nn.Module]


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        config: Any,
        layer_id: int,
        attention_cls: type[LlamaAttention],
        feed_forward: FeedForward,
    ) -> None:
        super().__init__()
        self.self_attn = attention_cls(config, layer_id)
        self.mlp = feed_forward(config, layer_id)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self, rope: Rope, hidden: torch.Tensor, residual: torch.Tensor, forward_batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`hidden` is the previous layer's output, not yet added to the residual stream."""
        hidden, residual = self.input_layernorm.forward_with_residual(hidden, residual)
        hidden = self.self_attn(rope, hidden, forward_batch)
        hidden, residual = self.post_attention_layernorm.forward_with_residual(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(
        self, config: Any, attention_cls: type[LlamaAttention], feed_forward: FeedForward
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, attention_cls, feed_forward)
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        # One table for all layers; each forward pass takes its positions' rows once.
        self.rotary_emb = RotaryEmbedding(
            head_dim_of(config), config.max_position_embeddings, rope_parameters(config)
        )

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        residual = torch.zeros_like(hidden)
        rope = self.rotary_emb(positions, hidden.dtype)
        executor = forward_batch.layers_executor
        if executor is None or not executor.run(rope, hidden, residual, forward_batch):
            for layer in self.layers:
                hidden, residual = layer(rope, hidden, residual, forward_batch)
        hidden, _ = self.norm.forward_with_residual(hidden, residual)
        return hidden

    def decoder_plan(self) -> DecoderPlan:
        """The layers as an executor runs them (this rank's heads)."""
        decoder_layers = cast("list[LlamaDecoderLayer]", list(self.layers))
        layers = []
        for layer in decoder_layers:
            attention, mlp = layer.self_attn, layer.mlp
            moe = mlp.plan() if isinstance(mlp, SparseMoeBlock) else None
            dense = None if moe is not None else cast("LlamaMLP", mlp)
            layers.append(
                DecoderLayerPlan(
                    layer_id=attention.attn.layer_id,
                    input_norm=layer.input_layernorm,
                    qkv=attention.qkv_proj,
                    q_norm=attention.q_norm if attention.qk_norm else None,
                    k_norm=attention.k_norm if attention.qk_norm else None,
                    o=attention.o_proj,
                    post_norm=layer.post_attention_layernorm,
                    gate_up=None if dense is None else dense.gate_up_proj,
                    down=None if dense is None else dense.down_proj,
                    moe=moe,
                )
            )
        first = decoder_layers[0].self_attn
        return DecoderPlan(
            heads=first.num_heads,
            kv_heads=first.num_kv_heads,
            head_dim=first.head_dim,
            scale=first.attn.scaling,
            layers=tuple(layers),
        )


@register_model("LlamaForCausalLM", "MistralForCausalLM", model_types=("llama", "mistral"))
class LlamaForCausalLM(nn.Module):
    attention_cls: type[LlamaAttention] = LlamaAttention
    # The GGUF layer tensor names this architecture's files hold (`weight_loader.py`).
    gguf_layer_names: ClassVar[Mapping[str, str]] = GGUF_LAYER_NAMES

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, self.attention_cls, self.feed_forward)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = ParallelLMHead(config.hidden_size, config.vocab_size)
        if self.tie_word_embeddings:  # one parameter, listed once, under the embedding's name
            self.lm_head.weight = self.model.embed_tokens.weight

    @classmethod
    def feed_forward(cls, config: Any, layer_id: int) -> nn.Module:
        """Layer `layer_id`'s feed-forward: the gated MLP (a mixture of experts overrides it)."""
        return LlamaMLP(config)

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """[batch, vocab] float32 logits of each sequence's next token."""
        hidden = self.model(input_ids, positions, forward_batch)
        return compute_logits(hidden, self.lm_head, forward_batch)

    def decoder_plan(self) -> DecoderPlan:
        """The decoder layers, for an executor (`layers/decoder_plan.py`)."""
        return self.model.decoder_plan()

    def load_weights(self, weights: Iterable[tuple[str, Loadable]]) -> None:
        """Copies checkpoint tensors (Hugging Face names) into the parameters; every parameter
        must be filled exactly once, shards of fused parameters included. GGUF blocks
        (`QuantizedWeight`) of a linear or embedding weight are kept as blocks, in place of the
        parameter; of any other parameter, dequantized into it."""
        params = dict(self.named_parameters())
        filled: dict[str, int] = dict.fromkeys(params, 0)
        expected = {name: self._shard_count(name) for name in params}
        blocks = QuantizedShards(self, self._shard_sizes)
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue
            target, shard = self._target_of(name)
            if target not in params:
                raise ValueError(f"checkpoint tensor {name} has no place in {type(self).__name__}")
            tensor = self._rank_shard(target, shard, tensor)
            if isinstance(tensor, LazyTensor):  # not cut for this rank: needed whole
                tensor = tensor.load()
            param = params[target]
            if isinstance(tensor, QuantizedWeight) and blocks.can_hold(target):
                blocks.add(target, shard, tensor, name)
            else:
                if isinstance(tensor, QuantizedWeight):
                    tensor = tensor.dequantize(param.dtype)
                with torch.no_grad():
                    if shard is None:
                        copy_checked(param, tensor, name)
                    else:
                        copy_shard(param, tensor, shard, self._shard_sizes(target), name)
            filled[target] += 1
        missing = [n for n, count in filled.items() if count != expected[n]]
        if missing:
            raise ValueError(f"checkpoint lacks weights for {', '.join(sorted(missing)[:8])}")
        blocks.install(params)
        embedding = self.model.embed_tokens
        if self.tie_word_embeddings and embedding.quant is not None:
            self.lm_head.set_quantized(embedding.quant)  # the same blocks, read by both

    def _target_of(self, name: str) -> tuple[str, int | None]:
        for part, (fused, shard) in STACKED_PARAMS.items():
            if f".{part}." in name:
                return name.replace(f".{part}.", f".{fused}."), shard
        return name, None

    def _rank_shard(self, target: str, shard: int | None, tensor: Loadable) -> Loadable:
        """This rank's part of checkpoint tensor `tensor` (all of it with one rank)."""
        module = self.get_submodule(target.rpartition(".")[0])
        cut = getattr(module, "shard", None)
        if get_tp_group().size == 1 or cut is None:
            return tensor
        return cut(tensor, shard)

    def _shard_count(self, name: str) -> int:
        if ".qkv_proj." in name:
            return 3
        if ".gate_up_proj." in name:
            return 2
        return 1

    def _shard_sizes(self, name: str) -> list[int]:
        """Rows of each checkpoint shard of fused parameter `name`, as this rank holds them."""
        module = self.get_submodule(name.rpartition(".")[0])
        assert isinstance(module, ColumnParallelLinear), "only fused projections have shards"
        return module.local_sizes
