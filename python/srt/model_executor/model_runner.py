"""`ModelRunner`: one model on one device, its KV memory, forward passes and sampling.

The runner owns the tensors (weights, `ReqToTokenPool`, `KVPool`, each request's sampling state)
and is the one writer of `ReqToTokenPool`, but not the bookkeeping of which KV slots and rows
are free: the scheduler allocates them and passes them in with each batch
(`worker_batch.ModelWorkerBatch`), and gets token ids back, never logits.
"""

from __future__ import annotations

import contextlib
import logging
from array import array
from collections.abc import Sequence

import torch

from srt import envs
from srt.constrained.xgrammar_backend import GrammarBackend
from srt.distributed import get_tp_group, kv_heads_per_rank
from srt.forward_mode import ForwardMode
from srt.kernels.cpu import plan_cache
from srt.kernels.cpu.quant_kernels import int8_activations
from srt.layers.attention.registry import create_attention_backend
from srt.layers.forward_batch import ForwardBatch
from srt.layers.linear import plan_products, prepare_for_device, uninitialized
from srt.layers.quantization import quantize_int8, weight_forms
from srt.mem_cache.memory_pool import KVPool, ReqToTokenPool
from srt.model_executor.cpu_decode import CpuDecodeExecutor
from srt.model_executor.cuda_graph_runner import CudaGraphRunner, capture_batch_sizes
from srt.model_executor.model_config import ModelConfig
from srt.model_executor.resolve import resolve_device_defaults
from srt.model_executor.sampling_info import SamplingStates
from srt.model_executor.weight_loader import iterate_weight_slices, iterate_weights
from srt.model_executor.worker_batch import (
    GenerationBatchResult,
    GrammarStatus,
    JumpForward,
    ModelWorkerBatch,
    RequestSamplingSpec,
    RunnerLimits,
)
from srt.models.registry import model_class_for
from srt.server_args import ServerArgs
from srt.startup import Stages

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, server_args: ServerArgs, model_path: str) -> None:
        # The device defaults are resolved here, before any weight is loaded (a backend that
        # cannot run on the device is refused at once); everything else reads `server_args`.
        # Each stage of the start logs its seconds.
        stages = Stages()
        self.server_args = server_args = resolve_device_defaults(server_args)
        self.device = torch.device(server_args.device)
        # One rank of `--tp-size` (srt.distributed, joined by the scheduler process), or alone.
        self.tp = get_tp_group()
        self.model_config = ModelConfig.load(
            model_path,
            server_args.dtype,
            self.device,
            server_args.context_length,
            server_args.trust_remote_code,
            server_args.quantization,
        )
        stages.done("model config")
        self.init_model(stages)
        self.init_memory_pool()
        stages.done("KV cache")
        backend = server_args.attention_backend
        assert backend is not None, "resolved above"
        self.attn_backend = create_attention_backend(
            backend, self.model, self.model_config.dtype, self.device
        )
        self.init_cuda_graphs()
        config = self.model_config
        self.grammars = GrammarBackend(
            server_args.tokenizer_path or model_path,
            config.vocab_size,
            sorted(config.eos_token_ids),
            server_args.trust_remote_code,
            server_args.constrained_json_any_whitespace,
        )
        sync = self.tp.broadcast_ints if self.tp.size > 1 else None
        self.sampling = SamplingStates(self.grammars, config.vocab_size, sync)
        if server_args.random_seed is not None:
            torch.manual_seed(server_args.random_seed)
        stages.done("attention, CUDA graphs, sampling")

    @property
    def limits(self) -> RunnerLimits:
        config = self.model_config
        return RunnerLimits(
            context_length=config.context_length,
            vocab_size=config.vocab_size,
            eos_token_ids=config.eos_token_ids,
            max_total_tokens=self.max_total_tokens,
            max_running_requests=self.max_running_requests,
        )

    def init_model(self, stages: Stages) -> None:
        config = self.model_config
        model_cls = model_class_for(config.hf_config)
        # Dummy weights are the random initialization; others are all read from the checkpoint.
        dummy = self.server_args.load_format == "dummy"
        with torch.device(self.device), contextlib.nullcontext() if dummy else uninitialized():
            default_dtype = torch.get_default_dtype()
            torch.set_default_dtype(config.dtype)
            try:
                self.model = model_cls(config.hf_config)
            finally:
                torch.set_default_dtype(default_dtype)
        stages.done("model built")
        # Decode steps of the layers in one Rust call, for a model that states its layers.
        plan = getattr(self.model, "decoder_plan", None)
        cpu = self.device.type == "cpu"
        self.layers_executor = CpuDecodeExecutor(plan()) if plan is not None and cpu else None
        if not dummy:
            # Tensor-parallel ranks read only their shards of a safetensors checkpoint.
            read = iterate_weight_slices if self.tp.size > 1 else iterate_weights
            self.model.load_weights(  # type: ignore[operator]
                read(config.model_path, config.gguf_file, config.hf_config, config.quantization)
            )
        if config.quantization == "int8":
            quantize_int8(self.model)
        stages.done("weights read")
        # Serving never trains: without gradients the CPU kernels read parameters directly.
        self.model.eval().requires_grad_(False)
        prepare_for_device(self.model)
        stages.done("weights packed")
        # Products on GGUF blocks may round activations to int8 (`quant_kernels`).
        self.offer_int8_activations = (
            config.quantization == "gguf" and not self.server_args.disable_int8_activations
        )
        plans = plan_products(self.model, config.dtype, self.offer_int8_activations)
        if plans:
            counts = ", ".join(f"{n} {source}" for source, n in sorted(plans.items()))
            cache = (
                f"cache {plan_cache.directory()}"
                if plan_cache.enabled()
                else "cache off: SRT_DISABLE_KERNEL_PLAN_CACHE=1"
            )
            stages.done("kernel plans", f"{counts}; {cache}")
        forms = weight_forms(self.model)
        self.weight_bytes = sum(forms.values())
        held = ", ".join(
            f"{form} {nbytes / 2**20:.1f} MB"
            for form, nbytes in sorted(forms.items(), key=lambda item: -item[1])
            if nbytes
        )
        logger.info(
            "weights: %.1f MB (%s, quantization %s); held as %s",
            self.weight_bytes / 2**20,
            str(config.dtype).removeprefix("torch."),
            config.quantization,
            held,
        )

    def init_memory_pool(self) -> None:
        config = self.model_config
        kv_heads = kv_heads_per_rank(config.num_kv_heads, self.tp.size)  # this rank's
        bytes_per_slot = KVPool.bytes_per_slot(
            config.num_layers, kv_heads, config.head_dim, config.dtype
        )
        self.max_total_tokens = self.server_args.max_total_tokens or self._default_kv_slots(
            bytes_per_slot
        )
        if self.max_total_tokens < 2:
            raise ValueError(f"the KV cache holds only {self.max_total_tokens} tokens")
        assert self.server_args.max_running_requests is not None, "resolved in __init__"
        self.max_running_requests = self.server_args.max_running_requests
        self.req_to_token_pool = ReqToTokenPool(
            self.max_running_requests, config.context_length, self.device
        )
        self.kv_pool = KVPool(
            self.max_total_tokens,
            config.num_layers,
            kv_heads,
            config.head_dim,
            config.dtype,
            self.device,
        )
        # The slots of one largest prefill, the first that requests fill.
        resident = min(self.max_total_tokens, self.server_args.max_prefill_tokens)
        self.kv_pool.prefault(resident)
        logger.info(
            "KV cache: %d tokens (%.2f GiB, the first %d written now), %d request rows",
            self.max_total_tokens,
            self.max_total_tokens * bytes_per_slot / 2**30,
            resident,
            self.max_running_requests,
        )

    def init_cuda_graphs(self) -> None:
        """Captures decode CUDA graphs on CUDA unless turned off or the backend cannot."""
        self.cuda_graph_runner: CudaGraphRunner | None = None
        if self.device.type != "cuda" or self.server_args.disable_cuda_graph:
            return
        if self.tp.size > 1:
            logger.info("CUDA graphs are off: tensor-parallel decode runs its collectives eagerly")
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
            fraction = self.server_args.mem_fraction_static
            assert fraction is not None, "resolved in __init__"
            budget = free - total * (1 - fraction)
        else:
            budget = envs.cpu_kv_cache_gb() * 2**30
        return int(budget // bytes_per_slot)

    # ---- requests --------------------------------------------------------------------------

    def add_request(self, rid: str, spec: RequestSamplingSpec) -> None:
        """Builds the sampling state of a request the scheduler admits (once per request)."""
        self.sampling.add(rid, spec)

    def remove_request(self, rid: str) -> None:
        """Drops the sampling state of a request that is done (unknown ids are ignored)."""
        self.sampling.remove(rid)

    def grammar_status(self, kind: str, text: str) -> GrammarStatus:
        """Where grammar (`kind`, `text`) stands, its compile started if new. Alone it never
        waits; a tensor-parallel rank waits for the compile, so that every rank admits the
        request in the same step (a compile's end is a matter of timing, which ranks differ in)."""
        if self.tp.size > 1:
            self.grammars.wait(kind, text)
        return self.grammars.status(kind, text)

    def jump_forward(self, rid: str, max_rollback: int, budget: int) -> JumpForward | None:
        """Jumps constrained request `rid` over the text its grammar forces next, if worth it
        (`srt.constrained.jump_forward`)."""
        return self.sampling.jump_forward(rid, max_rollback, budget)

    # ---- forward passes ----------------------------------------------------------------------

    def forward_batch_generation(self, batch: ModelWorkerBatch) -> GenerationBatchResult:
        """Runs `batch` and samples: the next token of every sequence that samples, and the
        logprobs its request asked for."""
        with torch.inference_mode():
            logits = self.forward(self.prepare(batch))
            return self.sampling.sample(batch, logits)

    def prepare(self, batch: ModelWorkerBatch) -> ForwardBatch:
        """Records `batch`'s slots in `ReqToTokenPool` (its `row_writes`, then every new token's
        slot at its position) and builds the tensors of its forward pass."""
        pool = self.req_to_token_pool
        for row, start, slots in batch.row_writes:
            pool.write(row, start, _int32(slots))
        positions: list[int] = []
        token_rows: list[int] = []
        for row, seq_len, n in zip(batch.rows, batch.seq_lens, batch.extend_lens, strict=True):
            positions.extend(range(seq_len - n, seq_len))
            token_rows.extend([row] * n)
        out_cache_loc = _int32(batch.out_cache_loc)
        pool.write_tokens(token_rows, positions, out_cache_loc)
        forward_batch = self._forward_batch(
            batch.forward_mode,
            batch.input_ids,
            positions,
            out_cache_loc,
            batch.rows,
            batch.seq_lens,
            batch.extend_lens,
        )
        if batch.logit_lens is not None and any(n != 1 for n in batch.logit_lens):
            forward_batch.extend_logit_lens_cpu = list(batch.logit_lens)
        return forward_batch

    def prepare_extend(
        self,
        rows: list[int],
        prefix_lens: list[int],
        new_ids: list[list[int]],
        out_cache_loc: Sequence[int],
        logit_lens: list[int] | None = None,
    ) -> ForwardBatch:
        """A batch that appends `new_ids[i]` after the `prefix_lens[i]` cached tokens of request
        row `rows[i]`, writing their K/V to `out_cache_loc` (concatenated in batch order). With
        `logit_lens`, `forward` returns logits for the last `logit_lens[i]` new tokens of each
        sequence (prompt logprobs), else for its last one."""
        extend_lens = [len(ids) for ids in new_ids]
        return self.prepare(
            ModelWorkerBatch(
                forward_mode=ForwardMode.EXTEND,
                rids=[],
                rows=rows,
                seq_lens=[p + n for p, n in zip(prefix_lens, extend_lens, strict=True)],
                extend_lens=extend_lens,
                input_ids=[token for ids in new_ids for token in ids],
                out_cache_loc=array("i", out_cache_loc),
                row_writes=[],
                logit_lens=logit_lens,
            )
        )

    def prepare_decode(
        self,
        rows: list[int],
        seq_lens: list[int],
        next_ids: list[int],
        out_cache_loc: Sequence[int],
    ) -> ForwardBatch:
        """A batch that appends one token per request; `seq_lens` count it already."""
        return self.prepare(
            ModelWorkerBatch(
                forward_mode=ForwardMode.DECODE,
                rids=[],
                rows=rows,
                seq_lens=seq_lens,
                extend_lens=[1] * len(rows),
                input_ids=next_ids,
                out_cache_loc=array("i", out_cache_loc),
                row_writes=[],
            )
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
            layers_executor=self.layers_executor,
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
        with int8_activations(self.offer_int8_activations):
            logits: torch.Tensor = self.model(
                forward_batch.input_ids, forward_batch.positions, forward_batch
            )
        return logits


def _int32(ids: array[int]) -> torch.Tensor:
    """An int32 tensor sharing the memory of `ids`."""
    if not len(ids):
        return torch.empty(0, dtype=torch.int32)
    return torch.frombuffer(ids, dtype=torch.int32)
