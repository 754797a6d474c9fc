"""The token embedding: `nn.Embedding`, or rows looked up in GGUF blocks kept as the file holds
them (`set_quantized`), which a tied lm_head then multiplies by as well (see models/llama.py)."""

from __future__ import annotations

import torch
from torch import nn

from srt.layers.quant_kernels import QuantizedWeight


class VocabEmbedding(nn.Embedding):
    """`nn.Embedding` that may hold its table as a `QuantizedWeight` (`quant`; then the float
    `weight` parameter is gone and a lookup dequantizes just the rows it reads)."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.quant: QuantizedWeight | None = None
        # The dtype lookups return: the model's, which the float table was made in.
        self.dtype = self.weight.dtype

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
