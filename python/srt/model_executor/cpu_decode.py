"""The CPU decode executor: a decode step of a model's decoder layers (its `DecoderPlan`,
`layers/decoder_plan.py`) in one call to the Rust kernels (`srt._rust.DecoderStack`,
rust/kernels/src/decoder.rs), where every projection is a quantized weight (`QuantizedWeight`:
the default GGUF path; or a weight of parts in several formats, `QuantizedParts`, as the qkv
projection of llama.cpp's Q4_K_M files is held), in the integer kernel's tiles on CPUs with
AVX2 (with AVX-VNNI or without) or AVX-512 VNNI, in its blocks through the float kernel
elsewhere.

Why: at one sequence, a SmolLM2 decode step calls about 300 kernels, and the Python around
each call (module calls, output tensors, numpy views of its arguments) cost more than the
kernels' arithmetic: `benches/profile_decode_step.py` measured 4.1 ms of integer kernel in a
10.8 ms step. The stack calls the same kernels in the same order on the same values, so a step
gives the same bits either way; only the Python goes.

When it runs: decode steps on the CPU, float32 or bf16, whose attention can read the KV cache
in place (`CpuAttnBackend.in_place_decode`), with per-head q/k norms (Qwen3) or without,
with a gated MLP or a sparse mixture of such experts (Qwen3-MoE: every expert's projections
quantized; the float32 router's kernel is the one the Python mixture calls), on one
tensor-parallel rank (the stack has no all-reduce between a layer's shards), with a number of
sequences for which every projection's plan gives the path the stack takes
(`QuantizedWeight.stack_rows`: the few-row kernel, and on tiles the one-int8 kernel from the row
count where the plan first rounds activations to one int8). A plan may give a window of rows
between the two to the dense path, where the few-row kernel measured slower: those steps take
the layers one by one, the steps past the window the stack again. Elsewhere, or with
`SRT_FUSED_DECODE=0`, the layers run one by one.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

import torch

from srt import _rust, envs
from srt.distributed import get_tp_group
from srt.forward_mode import ForwardMode
from srt.kernels.cpu import cpu_kernels
from srt.kernels.cpu.quant_kernels import QuantizedWeight, Windows, int8_offered
from srt.kernels.cpu.quant_parts import QuantizedParts
from srt.layers.attention.cpu_backend import CpuAttnBackend
from srt.layers.decoder_plan import DecoderLayerPlan, DecoderPlan
from srt.layers.linear import Linear
from srt.tensor_views import numpy_view as _view

if TYPE_CHECKING:
    from srt.layers.forward_batch import ForwardBatch
    from srt.mem_cache.memory_pool import KVPool

logger = logging.getLogger(__name__)


def _stack_parts(name: str, linear: Linear) -> tuple[QuantizedWeight, ...] | str:
    """Projection `name`'s weight as the stack takes it (its parts, or the one weight), else why
    the stack cannot."""
    quant = linear.quant
    if isinstance(quant, QuantizedParts):
        return quant.parts
    if isinstance(quant, QuantizedWeight):
        return (quant,)
    return f"{name} is not a GGUF-quantized weight"


class CpuDecodeExecutor:
    """The decode path of one model's layers through `DecoderStack`, built at its first use
    for the model's KV pool (and again for another pool). The stack holds the weights in the
    form the layers' products read (tiles where the CPU has the integer kernel, else blocks:
    `QuantizedWeight.pack` decides once, and measuring the plans calls it first), and each
    projection's row count for one int8 while products may round activations to int8
    (`quant_kernels.int8_activations`: built again when that changes)."""

    def __init__(self, plan: DecoderPlan) -> None:
        self.plan = plan
        self.enabled = envs.fused_decode() and get_tp_group().size == 1
        # What the stack was built for: the pool, and whether int8 activations were offered.
        self._built_for: tuple[KVPool, bool] | None = None
        self._stack: _rust.DecoderStack | None = None
        # The windows [start, end) of sequences per step the stack runs; others take the
        # layers' path.
        self._batches: Windows = ()
        # The reasons already logged for not building a stack.
        self._said: set[str] = set()

    def run(
        self,
        rope: tuple[torch.Tensor, torch.Tensor],
        hidden: torch.Tensor,
        residual: torch.Tensor,
        forward_batch: ForwardBatch,
    ) -> bool:
        """Runs every layer on `hidden` (replaced in place by the last layer's output) and
        `residual` (updated in place) when this step qualifies; whether it did."""
        backend = forward_batch.attn_backend
        if (
            not self.enabled
            or forward_batch.forward_mode is not ForwardMode.DECODE
            or not isinstance(backend, CpuAttnBackend)
            or not cpu_kernels.runs_in_rust(hidden, residual)
        ):
            return False
        metadata = backend.in_place_decode()
        stack = None if metadata is None else self._ready(forward_batch.kv_pool, hidden.dtype)
        batch = forward_batch.batch_size
        if metadata is None or stack is None:
            return False
        if not any(start <= batch < end for start, end in self._batches):
            return False
        rows, seq_lens = metadata
        cos, sin = rope
        stack.decode(
            _view(hidden),
            _view(residual),
            _view(cos),
            _view(sin),
            forward_batch.out_cache_loc.numpy(),
            rows.numpy(),
            seq_lens.numpy(),
        )
        return True

    def _ready(self, pool: KVPool, dtype: torch.dtype) -> _rust.DecoderStack | None:
        """The stack that serves `pool` in `dtype`, built if the model qualifies (else None)."""
        built_for = (pool, int8_offered())
        if self._built_for == built_for:
            return self._stack
        self._built_for, self._stack = built_for, None
        plan = self.plan
        # The model runner builds this executor on the CPU only, where the pool is.
        if not plan.layers or pool.k_buffers[0].dtype != dtype:
            return None
        specs = []
        batches: Windows = ((0, sys.maxsize),)
        for layer in plan.layers:
            spec = self._layer_spec(layer, pool, dtype, built_for[1])
            if isinstance(spec, str):
                self._say_unfit(spec)
                return None
            specs.append(spec[0])
            for windows in spec[1]:
                batches = _intersection(batches, windows)
        self._stack = _rust.DecoderStack(
            plan.heads,
            plan.kv_heads,
            plan.head_dim,
            plan.layers[0].input_norm.eps,
            plan.scale,
            specs,
        )
        self._batches = batches
        return self._stack

    def _say_unfit(self, reason: str) -> None:
        """Logs, once per reason, why the decode steps take the layers one by one."""
        if reason not in self._said:
            self._said.add(reason)
            logger.info("decode steps run layer by layer, not in one Rust call: %s", reason)

    def _layer_spec(
        self, layer: DecoderLayerPlan, pool: KVPool, dtype: torch.dtype, offered: bool
    ) -> tuple[_rust.LayerSpec, list[Windows]] | str:
        """A layer's spec for `DecoderStack` and, per projection, the windows of rows where
        the stack's kernels take the path its plan gives; else why the stack cannot run it (a
        projection not quantized or in a form the stack does not take, a norm not of `dtype`
        or of another epsilon)."""
        named = {"qkv": layer.qkv, "o": layer.o}
        moe = layer.moe
        if moe is None:
            assert layer.gate_up is not None, "a dense layer's"
            assert layer.down is not None, "a dense layer's"
            named |= {"gate_up": layer.gate_up, "down": layer.down}
        else:
            for i, (gate_up, down) in enumerate(zip(moe.gate_up, moe.down, strict=True)):
                named |= {f"expert {i}'s gate_up": gate_up, f"expert {i}'s down": down}
        projections: dict[str, _rust.ProjectionSpec | list[_rust.ProjectionSpec]] = {}
        served = []
        for name, linear in named.items():
            parts = _stack_parts(name, linear)
            if isinstance(parts, str):
                return parts
            bias = None if linear.bias is None else linear.bias.detach().to(torch.float32)
            specs, start = [], 0
            for weight in parts:
                # First: measuring the plan packs the weight where it will be packed.
                one_int8_from, windows = weight.stack_rows(dtype, offered)
                served.append(windows)
                rows = slice(start, start + weight.out_features)
                start = rows.stop
                # The stack holds the numpy view, which holds the float32 copy.
                part_bias = None if bias is None else bias[rows].contiguous().numpy()
                specs.append(
                    _rust.ProjectionSpec(
                        format=weight.fmt,
                        packed=weight.packed,
                        weight=weight.held,
                        out_features=weight.out_features,
                        in_features=weight.in_features,
                        bias=part_bias,
                        one_int8_from=one_int8_from,
                    )
                )
            projections[name] = specs[0] if len(specs) == 1 else specs
        norms = [layer.input_norm, layer.post_norm]
        if layer.q_norm is not None and layer.k_norm is not None:
            norms += [layer.q_norm, layer.k_norm]
        # The stack normalizes with the first norm's epsilon.
        if any(n.weight.dtype != dtype or n.eps != norms[0].eps for n in norms):
            return f"the norms of a layer are not all {dtype} with one epsilon"
        weights = [_view(n.weight.detach()) for n in norms]
        qk_norms = {"q_norm": weights[2], "k_norm": weights[3]} if weights[2:] else {}
        feed_forward: dict[str, Any]
        if moe is None:
            feed_forward = {"gate_up": projections["gate_up"], "down": projections["down"]}
        else:
            experts = range(len(moe.gate_up))
            mixture = _rust.MoeSpec(
                router=_view(moe.router.detach()),
                gate_up=[projections[f"expert {i}'s gate_up"] for i in experts],
                down=[projections[f"expert {i}'s down"] for i in experts],
                top_k=moe.top_k,
                renormalize=moe.renormalize,
            )
            feed_forward = {"moe": mixture}
        index = layer.layer_id
        spec = _rust.LayerSpec(
            input_norm=weights[0],
            qkv=projections["qkv"],
            o=projections["o"],
            post_norm=weights[1],
            k_cache=_view(pool.k_buffers[index]),
            v_cache=_view(pool.v_buffers[index]),
            **feed_forward,
            **qk_norms,
        )
        return spec, served


def _intersection(a: Windows, b: Windows) -> Windows:
    """The row counts in both `a` and `b`, as windows [start, end) by rising start."""
    both = ((max(s, t), min(e, f)) for s, e in a for t, f in b)
    return tuple((start, end) for start, end in both if start < end)
