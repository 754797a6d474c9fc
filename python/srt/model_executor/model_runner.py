"""`ModelRunner`: one model on one device, its KV memory, and forward passes over batches.

The runner owns the tensors (weights, `ReqToTokenPool`, `KVPool`) but not the bookkeeping of
which KV slots are free: the scheduler allocates slots and passes them in with each batch.
"""

from __future__ import annotations

import logging

import torch

from srt import envs
from srt.layers.attention.registry import create_attention_backend, resolve_attention_backend
from srt.layers.forward_batch import ForwardBatch, ForwardMode
from srt.layers.linear import prepare_for_device
from srt.mem_cache.memory_pool import KVPool, ReqToTokenPool
from srt.model_executor.cuda_graph_runner import CudaGraphRunner, capture_batch_sizes
from srt.model_executor.model_config import ModelConfig
from srt.model_executor.weight_loader import iterate_weights
from srt.models.registry import model_class_for
from srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

DEFAULT_MAX_RUNNING_REQUESTS = 256
DEFAULT_MEM_FRACTION_STATIC = 0.85


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but CUDA is not available")
    return torch.device(name)


class ModelRunner:
    def __init__(self, server_args: ServerArgs, model_path: str) -> None:
        self.server_args = server_args
        self.device = resolve_device(server_args.device)
        # Refuse a backend that cannot run here before any weight is loaded.
        attention_backend = resolve_attention_backend(server_args.attention_backend, self.device)
        self.model_config = ModelConfig.load(
            model_path,
            server_args.dtype,
            self.device,
            server_args.context_length,
            server_args.trust_remote_code,
        )
        self.init_model()
        self.init_memory_pool()
        self.attn_backend = create_attention_backend(
            attention_backend, self.model, self.model_config.dtype, self.device
        )
        self.init_cuda_graphs()

    def init_model(self) -> None:
        config = self.model_config
        model_cls = model_class_for(config.hf_config)
        with torch.device(self.device):
            default_dtype = torch.get_default_dtype()
            torch.set_default_dtype(config.dtype)
            try:
                self.model = model_cls(config.hf_config)
            finally:
                torch.set_default_dtype(default_dtype)
        if self.server_args.load_format != "dummy":  # dummy keeps the random initialization
            self.model.load_weights(  # type: ignore[operator]
                iterate_weights(config.model_path, config.gguf_file, config.hf_config)
            )
        self.model.eval()
        prepare_for_device(self.model)

    def init_memory_pool(self) -> None:
        config = self.model_config
        bytes_per_slot = KVPool.bytes_per_slot(
            config.num_layers, config.num_kv_heads, config.head_dim, config.dtype
        )
        self.max_total_tokens = self.server_args.max_total_tokens or self._default_kv_slots(
            bytes_per_slot
        )
        if self.max_total_tokens < 2:
            raise ValueError(f"the KV cache holds only {self.max_total_tokens} tokens")
        self.max_running_requests = (
            self.server_args.max_running_requests or DEFAULT_MAX_RUNNING_REQUESTS
        )
        self.req_to_token_pool = ReqToTokenPool(
            self.max_running_requests, config.context_length, self.device
        )
        self.kv_pool = KVPool(
            self.max_total_tokens,
            config.num_layers,
            config.num_kv_heads,
            config.head_dim,
            config.dtype,
            self.device,
        )
        logger.info(
            "KV cache: %d tokens (%.2f GiB), %d request rows",
            self.max_total_tokens,
            self.max_total_tokens * bytes_per_slot / 2**30,
            self.max_running_requests,
        )

    def init_cuda_graphs(self) -> None:
        """Captures decode CUDA graphs on CUDA unless turned off or the backend cannot."""
        self.cuda_graph_runner: CudaGraphRunner | None = None
        if self.device.type != "cuda" or self.server_args.disable_cuda_graph:
            return
        if not self.attn_backend.supports_cuda_graph:
            logger.info(
                "CUDA graphs are off: the %s attention backend cannot run under them",
                type(self.attn_backend).__name__,
            )
            return
        sizes = capture_batch_sizes(self.server_args.cuda_graph_max_bs, self.max_running_requests)
        self.cuda_graph_runner = CudaGraphRunner(self, sizes, capture=True)

    def _default_kv_slots(self, bytes_per_slot: int) -> int:
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            fraction = self.server_args.mem_fraction_static or DEFAULT_MEM_FRACTION_STATIC
            budget = free - total * (1 - fraction)
        else:
            budget = envs.cpu_kv_cache_gb() * 2**30
        return int(budget // bytes_per_slot)

    def prepare_extend(
        self,
        rows: list[int],
        prefix_lens: list[int],
        new_ids: list[list[int]],
        out_cache_loc: torch.Tensor,
        logit_lens: list[int] | None = None,
    ) -> ForwardBatch:
        """A batch that appends `new_ids[i]` after the `prefix_lens[i]` cached tokens of request
        row `rows[i]`, writing their K/V to `out_cache_loc` (concatenated in batch order). With
        `logit_lens`, `forward` returns logits for the last `logit_lens[i]` new tokens of each
        sequence (prompt logprobs), else for its last one."""
        extend_lens = [len(ids) for ids in new_ids]
        positions = [p for prefix, n in zip(prefix_lens, extend_lens, strict=True)
                     for p in range(prefix, prefix + n)]  # fmt: skip
        seq_lens = [p + n for p, n in zip(prefix_lens, extend_lens, strict=True)]
        start = 0
        for row, prefix, n in zip(rows, prefix_lens, extend_lens, strict=True):
            self.req_to_token_pool.write(row, prefix, out_cache_loc[start : start + n])
            start += n
        flat_ids = [token for ids in new_ids for token in ids]
        batch = self._forward_batch(
            ForwardMode.EXTEND, flat_ids, positions, out_cache_loc, rows, seq_lens, extend_lens
        )
        if logit_lens is not None and any(n != 1 for n in logit_lens):
            batch.extend_logit_lens_cpu = list(logit_lens)
        return batch

    def prepare_decode(
        self, rows: list[int], seq_lens: list[int], next_ids: list[int], out_cache_loc: torch.Tensor
    ) -> ForwardBatch:
        """A batch that appends one token per request; `seq_lens` count it already."""
        positions = [n - 1 for n in seq_lens]
        for i, (row, position) in enumerate(zip(rows, positions, strict=True)):
            self.req_to_token_pool.write(row, position, out_cache_loc[i : i + 1])
        return self._forward_batch(
            ForwardMode.DECODE, next_ids, positions, out_cache_loc, rows, seq_lens, [1] * len(rows)
        )

    def _forward_batch(
        self,
        mode: ForwardMode,
        input_ids: list[int],
        positions: list[int],
        out_cache_loc: torch.Tensor,
        rows: list[int],
        seq_lens: list[int],
        extend_lens: list[int],
    ) -> ForwardBatch:
        def tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=self.device)

        return ForwardBatch(
            forward_mode=mode,
            input_ids=tensor(input_ids),
            positions=tensor(positions),
            out_cache_loc=out_cache_loc.to(device=self.device, dtype=torch.int64),
            req_pool_indices=tensor(rows),
            seq_lens=tensor(seq_lens),
            seq_lens_cpu=seq_lens,
            extend_seq_lens_cpu=extend_lens,
            req_to_token_pool=self.req_to_token_pool,
            kv_pool=self.kv_pool,
            attn_backend=self.attn_backend,
        )

    @torch.inference_mode()
    def forward(self, forward_batch: ForwardBatch) -> torch.Tensor:
        """[rows, vocab] float32 logits: one row per sequence, of its next token, unless the
        extend asked for more (`prepare_extend`'s `logit_lens`: that many rows per sequence, its
        last new tokens in order). Decode logits replayed from a CUDA graph stay valid until the
        next decode forward."""
        graphs = self.cuda_graph_runner
        if graphs is not None and graphs.can_run(forward_batch):
            return graphs.run(forward_batch)
        self.attn_backend.init_forward_metadata(forward_batch)
        logits: torch.Tensor = self.model(
            forward_batch.input_ids, forward_batch.positions, forward_batch
        )
        return logits
