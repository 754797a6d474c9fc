"""The token embedding: `nn.Embedding`, or rows looked up in GGUF blocks kept as the file holds
them (`set_quantized`), which a tied lm_head then multiplies by as well (see models/llama.py);
and its tensor-parallel form, the vocabulary split over the ranks (`VocabParallelEmbedding`)."""

from __future__ import annotations

import torch
from torch import nn

from srt.distributed import get_tp_group
from srt.kernels.cpu.quant_kernels import QuantizedWeight
from srt.layers.linear import initializing
from srt.layers.parallel_linear import Loadable, shard_vocab, vocab_shard


class VocabEmbedding(nn.Embedding):
    """`nn.Embedding` that may hold its table as a `QuantizedWeight` (`quant`; then the float
    `weight` parameter is gone and a lookup dequantizes just the rows it reads)."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.quant: QuantizedWeight | None = None
        # The dtype lookups return: the model's, which the float table was made in.
        self.dtype = self.weight.dtype

    def reset_parameters(self) -> None:
        if initializing():
            super().reset_parameters()

    def set_quantized(self, quant: QuantizedWeight) -> None:
        """Holds the table as `quant` from now on and drops the float parameter."""
        if (quant.out_features, quant.in_features) != (self.num_embeddings, self.embedding_dim):
            raise ValueError(
                f"a quantized [{quant.out_features}, {quant.in_features}] table cannot serve a "
                f"[{self.num_embeddings}, {self.embedding_dim}] embedding"
            )
        self.quant = quant
        self.register_parameter("weight", None)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.quant is None:
            return super().forward(input_ids)
        flat = input_ids.reshape(-1)
        return self.quant.rows(flat, self.dtype).view(*input_ids.shape, self.embedding_dim)


class VocabParallelEmbedding(VocabEmbedding):
    """The table's vocabulary rows in equal shares over the tensor-parallel ranks
    (`parallel_linear.vocab_shard`): each rank looks up the ids in its share, zeros for the
    others, and the ranks' rows are summed (all-reduce), so every rank gets every row. A tied
    lm_head (`ParallelLMHead`) holds the same share."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        start, end, per_rank = vocab_shard(num_embeddings)
        super().__init__(per_rank, embedding_dim)
        self.tp = get_tp_group()
        self.vocab_size, self.vocab_start, self.vocab_end = num_embeddings, start, end

    def shard(self, tensor: Loadable, part: int | None) -> Loadable:
        return shard_vocab(tensor, self.vocab_size, self.vocab_start, self.vocab_end)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return super().forward(input_ids)
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local = torch.where(mine, input_ids - self.vocab_start, 0)
        rows = super().forward(local)
        rows.masked_fill_(~mine.unsqueeze(-1), 0)
        return self.tp.all_reduce(rows)
