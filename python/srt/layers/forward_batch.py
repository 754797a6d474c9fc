"""`ForwardBatch`: the tensors of one forward pass, as the model and attention layers read them.

It is a plain record, built by the model runner from the scheduler's `ModelWorkerBatch` (ints),
and knows nothing of requests: every new token has an input id, a position and the KV slot it
is written to, and every sequence has its row in `ReqToTokenPool`, its total length after this
pass and, when extending, how many of its tokens are new and how many of them need logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from srt.forward_mode import ForwardMode

if TYPE_CHECKING:
    from srt.layers.attention.base import AttentionBackend
    from srt.layers.decoder_plan import LayersExecutor
    from srt.mem_cache.memory_pool import KVPool, ReqToTokenPool


@dataclass(eq=False)
class ForwardBatch:
    forward_mode: ForwardMode
    input_ids: torch.Tensor  # [tokens] int64, the new tokens of every sequence, concatenated
    positions: torch.Tensor  # [tokens] int64
    out_cache_loc: torch.Tensor  # [tokens] int64, the KV slot each new token is written to
    req_pool_indices: torch.Tensor  # [batch] int64, each sequence's row in ReqToTokenPool
    seq_lens: torch.Tensor  # [batch] int64, cached + new tokens
    seq_lens_cpu: list[int]
    extend_seq_lens_cpu: list[int]  # new tokens per sequence (all 1 when decoding)
    req_to_token_pool: ReqToTokenPool
    kv_pool: KVPool
    attn_backend: AttentionBackend
    # Extend only: how many of each sequence's last new tokens get logits (None: the last one
    # each); the rows before the last serve prompt logprobs.
    extend_logit_lens_cpu: list[int] | None = None
    # What may run the model's decoder layers whole (`layers/decoder_plan.py`; None: they run
    # one by one).
    layers_executor: LayersExecutor | None = None

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def extend_prefix_lens_cpu(self) -> list[int]:
        return [s - e for s, e in zip(self.seq_lens_cpu, self.extend_seq_lens_cpu, strict=True)]
