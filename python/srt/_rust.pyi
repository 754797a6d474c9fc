"""Type stubs of the private Rust extension `srt._rust` (see rust/python/src/lib.rs).

Only srt's facades over the extension import this module (docs/design.md §8 lists them).
"""

from array import array
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray
from typing_extensions import Buffer

# Runs of token or slot ids: an int32 buffer (`array('i')`, numpy int32; read in one copy) or,
# slower, a list or tuple of ints. Runs of slots come back as `array('i')`.
_Ids = Buffer | Sequence[int]

__version__: str

class InvariantError(RuntimeError):
    """A data structure of srt's Rust crates found one of its invariants broken (a bug in srt)."""

# --- radix tree and KV-slot allocator (rust/python/src/radix.rs, allocator.rs) -----------------

class RadixTree:
    """The prefix cache's radix tree: token-id prefixes → the KV slots that hold them."""

    def __init__(self, page_size: int = 1) -> None: ...
    @property
    def page_size(self) -> int: ...
    def root(self) -> int: ...
    def match_prefix(self, tokens: _Ids) -> tuple[array[int], int]: ...
    def insert(self, tokens: _Ids, slots: _Ids) -> int: ...
    def lock(self, node: int) -> int: ...
    def unlock(self, node: int) -> int: ...
    def evict(self, num_tokens: int) -> array[int]: ...
    def evict_into(self, allocator: TokenAllocator, num_tokens: int) -> int: ...
    def evictable_size(self) -> int: ...
    def protected_size(self) -> int: ...
    def total_size(self) -> int: ...
    def reset(self) -> None: ...
    def validate(self) -> None: ...

class TokenAllocator:
    """The free list of KV slots (whole pages of them when `page_size > 1`); slot 0 is padding."""

    def __init__(self, size: int, page_size: int = 1) -> None: ...
    @property
    def size(self) -> int: ...
    @property
    def page_size(self) -> int: ...
    def available(self) -> int: ...
    def alloc(self, n: int) -> array[int] | None: ...
    def free(self, slots: _Ids) -> None: ...
    def clear(self) -> None: ...
    def is_allocated(self, slot: int) -> bool: ...

# --- incremental detokenizer (rust/python/src/detokenizer.rs) ---

class IncrementalDetokenizer:
    """Incremental detokenizer over a `tokenizer.json`, with the decode state of many requests."""

    def __init__(self, tokenizer_json: str) -> None: ...
    def add_request(
        self,
        rid: str,
        *,
        skip_special_tokens: bool,
        context_ids: Sequence[int],
    ) -> None: ...
    def step(self, rid: str, new_ids: Sequence[int]) -> str: ...
    def step_batch(self, rids: Sequence[str], new_ids: Sequence[Sequence[int]]) -> list[str]: ...
    def finish(self, rid: str) -> str: ...
    def free(self, rid: str) -> None: ...
    def __len__(self) -> int: ...
    def __contains__(self, key: str) -> bool: ...

# --- shared-memory rings (rust/python/src/ring.rs) ---

class ShmRing:
    """One end (producer or consumer) of a shared-memory ring of byte messages.

    A message longer than `max_frame_len` is split into parts of at most `part_len` bytes by the
    producer and reassembled by the consumer: no message is too long for a ring. A gone peer
    raises `BrokenPipeError` from `wait`/`finish_wait`; a corrupt ring raises `InvariantError`.
    """

    @staticmethod
    def create(name: str, capacity: int) -> None:
        """Creates the named ring with a data area of `capacity` bytes (a power of two)."""

    @staticmethod
    def unlink(name: str) -> bool:
        """Removes the ring's names; returns whether any existed."""

    @staticmethod
    def attach(name: str, role: str) -> ShmRing:
        """Attaches as `"producer"` or `"consumer"`; the second end to attach unlinks the names."""

    def try_push(self, data: bytes) -> bool:
        """Appends one message; `False` (nothing accepted) when there is no room now. A message
        longer than `max_frame_len` is accepted once its first part is in; the rest is pushed
        before anything else, by later pushes or `flush()`."""

    def try_push_frame(self, data: bytes) -> bool:
        """Appends a message if it fits in one frame and there is room now; `False` (nothing
        accepted) otherwise, also for a message that `try_push` would split."""

    def flush(self) -> bool:
        """Pushes what fits of the rest of a split message; `True` when nothing is left."""

    def try_pop(self) -> bytes | None:
        """Removes and returns the oldest message, or `None` when no whole message is there."""

    def try_pop_many(self, max: int, max_bytes: int) -> list[bytes]:
        """Removes and returns up to `max` messages (stopping once they hold `max_bytes`), oldest
        first; empty when none is there."""

    def spin(self, timeout: float, need: int = 0) -> bool:
        """Polls (GIL released, no sleep) up to `timeout` seconds; whether this end may proceed."""

    def fileno(self) -> int:
        """The descriptor this end sleeps on; readable when the peer rang or went away."""

    def prepare_wait(self, need: int = 0) -> bool:
        """Announces a sleep on `fileno()`; `False` when this end can proceed now. A producer
        passes the length of the message it waits to push."""

    def finish_wait(self) -> None:
        """Ends a sleep on `fileno()`; raises `BrokenPipeError` when the peer is gone."""

    def wait(self, timeout: float | None = None, need: int = 0) -> bool:
        """Blocks (GIL released) until this end may proceed; `False` on timeout."""

    @property
    def name(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def capacity(self) -> int: ...
    @property
    def max_frame_len(self) -> int: ...
    @property
    def part_len(self) -> int: ...
    @property
    def peer_pid(self) -> int: ...

# --- CPU linear layers (rust/python/src/gemm.rs) -----------------------------------------------
# Float32 buffers: C-contiguous numpy views of CPU tensors, shared, not copied. Sizes are
# checked against the buffers before any is read: a size that does not fit them, or whose
# products overflow 64 bits, is a ValueError.
_Floats = Buffer | NDArray[np.float32]
# A bf16 tensor's memory, as the int16 of its bits (numpy has no bf16).
_Bf16 = Buffer | NDArray[np.int16]

def linear_supported() -> bool:
    """Whether this CPU runs `linear` (x86-64 with AVX2 and FMA)."""

def packed_weight_len(n: int, k: int) -> int:
    """The number of floats of a packed `[n, k]` weight (ValueError past 64 bits)."""

def pack_weight(weight: _Floats, n: int, k: int, packed: _Floats) -> None:
    """Packs a row-major `[n, k]` float32 weight into `packed` for `linear`."""

def linear(
    x: _Floats, m: int, packed: _Floats, n: int, k: int, bias: _Floats | None, out: _Floats
) -> None:
    """`out[m, n] = x[m, k] · Wᵀ + bias` (GIL released, on PyTorch's OpenMP threads)."""

# --- CPU decode attention (rust/python/src/attention.rs) ----------------------------------------

def decode_attention(
    q: _Floats | _Bf16,
    k_cache: _Floats | _Bf16,
    v_cache: _Floats | _Bf16,
    slots: Buffer | NDArray[np.int32],
    seq_lens: Buffer | NDArray[np.int32],
    kv_heads: int,
    head_dim: int,
    scale: float,
    out: _Floats | _Bf16,
) -> None:
    """`out[b] = softmax(q[b] · Kᵀ · scale) · V` over the first `seq_lens[b]` slots of row `b`
    of `slots` ([batch, width] int32), each query head against its KV head (GIL released). q,
    the caches and the output are all float32 or all bf16 (float32 arithmetic, output rounded)."""

def prefill_attention_bf16(
    q: _Bf16,
    k: _Bf16,
    v: _Bf16,
    heads: int,
    kv_heads: int,
    head_dim: int,
    prefix: int,
    scale: float,
    out: _Bf16,
) -> None:
    """Causal attention of one sequence's new tokens (q: [new, heads, head_dim]) over its
    `prefix` cached tokens and themselves (k, v: [prefix + new, kv_heads, head_dim]), bf16 in
    and out, float32 sums; head_dim a multiple of 32 (GIL released)."""

def prefill_attention_paged_bf16(
    q: _Bf16,
    k_cache: _Bf16,
    v_cache: _Bf16,
    slots: NDArray[np.int32],
    prefix_lens: NDArray[np.int32],
    new_lens: NDArray[np.int32],
    heads: int,
    kv_heads: int,
    head_dim: int,
    scale: float,
    out: _Bf16,
) -> None:
    """Causal attention of a pass's sequences at once (q: [tokens, heads, head_dim], their new
    tokens in order) over their keys in a layer's caches (k_cache, v_cache: [slots, kv_heads,
    head_dim]): sequence i has prefix_lens[i] cached tokens then new_lens[i] new ones, whose
    slots follow one another in `slots`; bf16 in and out, float32 sums (GIL released)."""

# --- CPU row-wise operators (rust/python/src/ops.rs) --------------------------------------------

def rms_norm(
    x: _Floats | _Bf16,
    residual: _Floats | _Bf16 | None,
    weight: _Floats | _Bf16,
    eps: float,
    out: _Floats | _Bf16,
) -> None:
    """`out = weight · x / sqrt(mean(x²) + eps)` per row of `len(weight)` floats; with
    `residual`, `residual += x` first (in place) and the sum is normalized. All float32, or all
    bf16 (rounded where PyTorch's bf16 operators round)."""

def silu_and_mul(gate_up: _Floats | _Bf16, dim: int, out: _Floats | _Bf16) -> None:
    """`out = silu(gate) · up` per row, where a row of `gate_up` is `[gate | up]`, each `dim`
    floats. Both float32, or both bf16 (silu rounded before the product)."""

def rotary(
    x: _Floats | _Bf16,
    x_stride: int,
    cos: _Floats | _Bf16,
    sin: _Floats | _Bf16,
    head_dim: int,
    out: _Floats | _Bf16,
) -> None:
    """`out = x · cos + [x₂ | x₁] · sin` for every head of each token's row of `x`; `cos` and
    `sin` are `[tokens, head_dim]`, `sin` signed as `[-sin | sin]`. The rows of `x` lie
    `x_stride` elements apart (`x` spans the first row's start to the last row's end); `out` is
    contiguous, its length giving the row width. All float32, or all bf16 (each product and the
    sum rounded)."""

def moe_route(
    x: _Floats | _Bf16,
    router: _Floats,
    experts: int,
    top_k: int,
    renormalize: bool,
    ids: NDArray[np.int64],
    weights: _Floats,
) -> None:
    """Each row of `x` (`[rows, hidden]`, float32 or bf16) routed through `router` (float32
    `[experts, hidden]`): float32 logits, softmax, its `top_k` experts in descending
    probability (a tie to the lower index) into `ids` (`[rows, top_k]`) and their
    probabilities into `weights`, divided by their sum when `renormalize`."""

def cpu_isa() -> tuple[str, str]:
    """The instruction set the CPU kernels run now and the best the CPU runs: each one of
    "scalar", "avx2", "avx512", "avx512_vnni", "avx512_bf16"."""

def set_cpu_isa(name: str) -> None:
    """Caps the CPU kernels' instruction set at `name` (ValueError for an unknown name)."""

def cpu_bf16_matmul() -> tuple[bool, bool]:
    """Whether bf16 matrix products run natively (AVX-512 BF16 or AMX-BF16; false when the
    kernels are capped below the CPU's tier), and whether the CPU has AMX-BF16."""

# --- KV store row scatter (rust/python/src/scatter.rs) ------------------------------------------

def scatter_rows(
    src: _Floats | _Bf16,
    src_stride: int,
    width: int,
    slots: Buffer | NDArray[np.int64],
    buffer: _Floats | _Bf16,
) -> None:
    """Copies row `i` of `src` (`width` elements at `i · src_stride`; `src` spans the first
    row's start to the last row's end) to row `slots[i]` (int64) of `buffer`, both float32 or
    both int16 (bf16 bits). Every slot is checked (`ValueError` outside the buffer) before any
    row is written."""

# --- Thread pinning (rust/python/src/threads.rs) ---------------------------------------------

def pin_threads(cpus: list[int]) -> int:
    """Pins OpenMP's threads one CPU each (thread t to cpus[t]) for every later parallel region;
    returns how many were pinned (fewer when the team is smaller). ValueError for an empty list,
    a CPU beyond a CPU set, or one the process may not run on."""

def thread_cpus() -> list[int]:
    """The CPUs the calling thread may run on."""

# --- GGUF quantized weights (rust/python/src/quant.rs) ------------------------------------------
# Blocks: a C-contiguous uint8 buffer of `[n, k // 32]` blocks ("q4_0", "q4_1", "q8_0") or
# `[n, k // 256]` super-blocks ("q4_k", "q5_k", "q6_k"); bfloat16 outputs are int16 buffers of
# the bits. Sizes are checked as for `linear`.
_Bytes = Buffer | NDArray[np.uint8]

def quant_block_bytes(fmt: str) -> int:
    """Bytes per block of `fmt`: of 32 weights, or a K-quant's ("q4_k", "q5_k", "q6_k")
    super-block of 256 (ValueError for an unknown format)."""

def quant_linear(
    fmt: str,
    x: _Floats,
    m: int,
    blocks: _Bytes,
    n: int,
    k: int,
    bias: _Floats | None,
    out: _Floats,
) -> None:
    """`out[m, n] = x[m, k] · Wᵀ + bias`, W read from its blocks (GIL released, on PyTorch's
    OpenMP threads)."""

def quant_dequantize(
    fmt: str,
    blocks: _Bytes,
    n: int,
    k: int,
    out: _Floats | NDArray[np.int16],
    ids: _Ids | NDArray[np.int32] | None = None,
) -> None:
    """W (`[n, k]`), or its rows `ids`, as float32 (`out` float32) or bfloat16 bits (`out`
    int16) (GIL released)."""

# --- The integer path: weights repacked into tiles (rust/python/src/packed.rs) -----------------
# Tiles: a C-contiguous uint8 buffer of `quant_packed_len(fmt, n, k)` bytes written by
# `quant_pack`; activations are split into two int8 parts per block of 32
# (rust/kernels/src/quant/packed.rs).

def quant_packed_kernel() -> str | None:
    """The integer kernel this CPU runs ("avx512_vnni", "avx2"), or None where there is none."""

def quant_packed_len(fmt: str, n: int, k: int) -> int:
    """Bytes of a packed `[n, k]` weight of `fmt`."""

def quant_pack(fmt: str, blocks: _Bytes, n: int, k: int, out: _Bytes) -> None:
    """Writes the `[n, k]` weight in blocks of `fmt` into `out` as tiles."""

def quant_packed_linear(
    fmt: str,
    x: _Floats | NDArray[np.int16],
    m: int,
    packed: _Bytes,
    n: int,
    k: int,
    bias: _Floats | None,
    out: _Floats | NDArray[np.int16],
    int8_activations: bool = False,
) -> None:
    """`out[m, n] = x[m, k] · Wᵀ + bias` on the tiles, `x` and `out` both float32 or both
    bfloat16 bits (int16), the bias float32 (GIL released, on PyTorch's OpenMP threads).
    Activations are split into two int8 parts, or with `int8_activations` rounded to one int8
    per value per block of 32 (llama.cpp's Q8; rust/kernels/src/quant/packed/one_int8.rs): half
    the integer work, for products of many rows; not for the K-quants yet (ValueError)."""

def quant_packed_dequantize(
    fmt: str,
    packed: _Bytes,
    n: int,
    k: int,
    out: _Floats | NDArray[np.int16],
    ids: _Ids | NDArray[np.int32] | None = None,
) -> None:
    """The packed W, or its rows `ids`, as float32 or bfloat16 bits, equal to
    `quant_dequantize` on the blocks it was packed from (GIL released)."""

def quant_packed_dequantize_transposed(
    fmt: str, packed: _Bytes, n: int, k: int, out: _Floats | NDArray[np.int16]
) -> None:
    """The packed W transposed (`[k, n]`), as float32 or bfloat16 bits, each weight equal to
    `quant_packed_dequantize`'s (GIL released, on PyTorch's OpenMP threads)."""

# --- decode steps through a stack of decoder layers (rust/python/src/decoder.rs) ---------------

_LayerFloats = _Floats | NDArray[np.int16]

class ProjectionSpec:
    """A quantized projection of a decoder layer: its GGUF block format, its tiles (`packed`)
    or blocks, its shape, an optional float32 bias, and the rows from which its product rounds
    activations to one int8 (None: never). The buffers are held."""

    def __init__(
        self,
        *,
        format: str,
        packed: bool,
        weight: _Bytes,
        out_features: int,
        in_features: int,
        bias: _Floats | None,
        one_int8_from: int | None,
    ) -> None: ...

# A projection as a layer takes it: one spec, or its parts, whose outputs sit side by side (a
# fused weight whose shards differ in format).
_Projection = ProjectionSpec | list[ProjectionSpec]

class MoeSpec:
    """A sparse mixture of experts of a decoder layer: the router's float32
    `[experts, hidden_size]` weight, each expert's gate/up and down projections (one of each
    per expert), how many experts each token takes, and whether their weights are divided by
    their sum. The buffers are held."""

    def __init__(
        self,
        *,
        router: _Floats,
        gate_up: list[_Projection],
        down: list[_Projection],
        top_k: int,
        renormalize: bool,
    ) -> None: ...

class LayerSpec:
    """A decoder layer's norm weights (per-head `q_norm` and `k_norm` too, both or neither, as
    Qwen3 has them), projections (the feed-forward's `gate_up` and `down`, or `moe`; each one
    spec or a list of its parts) and K/V caches; the norms and caches float32 or bfloat16 bits
    (int16), of one type for the whole stack."""

    def __init__(
        self,
        *,
        input_norm: _LayerFloats,
        qkv: _Projection,
        o: _Projection,
        post_norm: _LayerFloats,
        k_cache: _LayerFloats,
        v_cache: _LayerFloats,
        gate_up: _Projection | None = None,
        down: _Projection | None = None,
        moe: MoeSpec | None = None,
        q_norm: _LayerFloats | None = None,
        k_norm: _LayerFloats | None = None,
    ) -> None: ...

class DecoderStack:
    """Llama-style decoder layers with packed projections, run one decode step per call (the
    kernels the layers call one by one, in the same order: the same bits)."""

    def __init__(
        self,
        heads: int,
        kv_heads: int,
        head_dim: int,
        eps: float,
        scale: float,
        layers: list[LayerSpec],
    ) -> None:
        """Every layer's spec, the norms and caches all float32 or all bfloat16 bits (int16);
        the buffers are held."""

    def __len__(self) -> int: ...
    def decode(
        self,
        hidden: _LayerFloats,
        residual: _LayerFloats,
        cos: _LayerFloats,
        sin: _LayerFloats,
        out_slots: NDArray[np.int64],
        slots: NDArray[np.int32],
        seq_lens: NDArray[np.int32],
    ) -> None:
        """One decode step: `hidden` replaced by the last layer's output, `residual` updated,
        the new tokens' K/V written at `out_slots` (GIL released)."""
