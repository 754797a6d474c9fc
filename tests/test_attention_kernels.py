"""The Triton extend and decode attention kernels against a plain torch reference (in Triton's
interpreter on CPU, so shapes stay tiny).

Every cache slot no request owns, slot 0 (padding) included, and every output row before the
launch hold NaN: a stray read or a missed write shows up as NaN in the comparison. Tolerances:
1e-5 (float32), 2e-3 (float16), absolute and relative. bfloat16 is left out: the interpreter's
`tl.dot` is wrong for it; `test_kernels_compile_for_gpu` at least compiles that path.
Inputs are made (seeded) on the CPU, the kernels run on TEST_DEVICE (the GPU when there is one),
and results are compared on the CPU.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch
from runner_helpers import TEST_DEVICE

from srt.kernels.triton.decode_attention import decode_attention_fwd
from srt.kernels.triton.extend_attention import extend_attention_fwd

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}


@dataclass
class PagedCache:
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor

    def on_device(self) -> PagedCache:
        return PagedCache(*(t.to(TEST_DEVICE) for t in vars(self).values()))


def make_cache(
    lengths: list[int], num_kv_heads: int, head_dim: int, dtype: torch.dtype, g: torch.Generator
) -> PagedCache:
    """A KV cache whose requests own shuffled slots, in shuffled rows of `req_to_token`."""
    num_slots = sum(lengths) + 9
    k_buffer = torch.full((num_slots, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    v_buffer = torch.full_like(k_buffer, float("nan"))
    slots = torch.randperm(num_slots - 1, generator=g)[: sum(lengths)] + 1
    k_buffer[slots] = torch.randn(len(slots), num_kv_heads, head_dim, generator=g).to(dtype)
    v_buffer[slots] = torch.randn(len(slots), num_kv_heads, head_dim, generator=g).to(dtype)
    req_to_token = torch.zeros(len(lengths) + 2, max(lengths) + 5, dtype=torch.int32)
    pool_rows = torch.randperm(len(lengths) + 2, generator=g)[: len(lengths)]
    for row, chunk in zip(pool_rows.tolist(), slots.split(lengths), strict=True):
        req_to_token[row, : len(chunk)] = chunk.int()
    return PagedCache(k_buffer, v_buffer, req_to_token, pool_rows)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """Attention of q [new, heads, d] over k, v [prefix + new, kv_heads, d], causal after the
    prefix, in float32."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) / math.sqrt(q.shape[2])
    visible = torch.arange(k.shape[0])[None, :] <= torch.arange(q.shape[0])[:, None] + prefix_len
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)


def run_extend(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    prefix_lens: list[int],
    extend_lens: list[int],
    dtype: torch.dtype,
    fused_qkv: bool = False,
    max_extend_len: int | None = None,
) -> None:
    g = torch.Generator().manual_seed(sum(prefix_lens) * 31 + sum(extend_lens) + head_dim)
    cache = make_cache(prefix_lens, num_kv_heads, head_dim, dtype, g)
    total = sum(extend_lens)
    width = num_heads + 2 * num_kv_heads
    qkv = torch.randn(total, width + (3 if fused_qkv else 0), head_dim, generator=g).to(dtype)
    qkv = qkv.to(TEST_DEVICE)  # before slicing, so the views keep their strides there
    q = qkv[:, :num_heads]
    k = qkv[:, num_heads : num_heads + num_kv_heads]
    v = qkv[:, num_heads + num_kv_heads : width]
    if not fused_qkv:  # otherwise strided views of one projection output, as a model makes them
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o = torch.full_like(q, float("nan"))
    extend_seq_lens = torch.tensor(extend_lens, dtype=torch.int32)
    extend_start_loc = torch.cumsum(extend_seq_lens, 0) - extend_seq_lens
    seq_lens = torch.tensor(prefix_lens) + extend_seq_lens.long()

    on = cache.on_device()
    extend_attention_fwd(
        q, k, v, o,
        on.k_buffer, on.v_buffer, on.req_to_token, on.req_pool_indices,
        seq_lens.to(TEST_DEVICE),
        extend_seq_lens.to(TEST_DEVICE),
        extend_start_loc.to(TEST_DEVICE),
        1.0 / math.sqrt(head_dim), max_extend_len,
    )  # fmt: skip
    q, k, v, o = q.cpu(), k.cpu(), v.cpu(), o.cpu()

    expected = []
    for i, (prefix, start, n) in enumerate(
        zip(prefix_lens, extend_start_loc.tolist(), extend_lens, strict=True)
    ):
        slots = cache.req_to_token[cache.req_pool_indices[i], :prefix].long()
        rows = slice(start, start + n)
        k_all = torch.cat([cache.k_buffer[slots], k[rows]])
        v_all = torch.cat([cache.v_buffer[slots], v[rows]])
        expected.append(reference(q[rows], k_all, v_all, prefix))
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(o.float(), torch.cat(expected), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "prefix_lens", "extend_lens"),
    [
        (2, 2, 16, [0, 5, 33, 0], [1, 20, 3, 17]),
        (4, 2, 24, [16, 0, 7], [16, 9, 2]),
        (6, 2, 80, [40, 0], [5, 11]),
    ],
)
def test_extend_matches_reference(
    dtype: torch.dtype,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    prefix_lens: list[int],
    extend_lens: list[int],
) -> None:
    run_extend(num_heads, num_kv_heads, head_dim, prefix_lens, extend_lens, dtype)


@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_extend_head_dims(head_dim: int) -> None:
    # The middle request brings no new token: its program exits without writing.
    run_extend(2, 1, head_dim, [3, 6, 0], [4, 0, 18], torch.float32)


def test_extend_strided_views_and_explicit_max_len() -> None:
    # q/k/v as column slices of one fused projection; a grid sized by a generous max_extend_len.
    run_extend(4, 2, 24, [9, 0], [13, 4], torch.float16, fused_qkv=True, max_extend_len=40)


def run_decode(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    seq_lens: list[int],
    num_kv_splits: int,
    dtype: torch.dtype,
    scratch: torch.Tensor | None = None,
) -> None:
    g = torch.Generator().manual_seed(sum(seq_lens) * 17 + num_kv_splits + head_dim)
    cache = make_cache(seq_lens, num_kv_heads, head_dim, dtype, g)
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=g).to(dtype)
    o = torch.full_like(q, float("nan"), device=TEST_DEVICE)

    on = cache.on_device()
    decode_attention_fwd(
        q.to(TEST_DEVICE), on.k_buffer, on.v_buffer, o, on.req_to_token, on.req_pool_indices,
        torch.tensor(seq_lens, dtype=torch.int32, device=TEST_DEVICE),
        1.0 / math.sqrt(head_dim),
        num_kv_splits=num_kv_splits, scratch=scratch,
    )  # fmt: skip
    o = o.cpu()

    expected = []
    for i, n in enumerate(seq_lens):
        slots = cache.req_to_token[cache.req_pool_indices[i], :n].long()
        k_all, v_all = cache.k_buffer[slots], cache.v_buffer[slots]
        expected.append(reference(q[i : i + 1], k_all, v_all, prefix_len=n - 1))
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(o.float(), torch.cat(expected), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "seq_lens", "num_kv_splits"),
    [
        (2, 2, 16, [1, 7, 40, 2], 8),  # more splits than tokens for three requests
        (8, 2, 24, [33, 1, 16], 3),
        (4, 1, 80, [21, 5], 1),
    ],
)
def test_decode_matches_reference(
    dtype: torch.dtype,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    seq_lens: list[int],
    num_kv_splits: int,
) -> None:
    run_decode(num_heads, num_kv_heads, head_dim, seq_lens, num_kv_splits, dtype)


def test_decode_group_wider_than_one_program() -> None:
    # 20 query heads per KV head: each group spans two stage-1 programs of 16 heads.
    run_decode(40, 2, 16, [19, 4], 4, torch.float32)


def test_decode_into_preallocated_scratch() -> None:
    scratch = torch.full((2, 4, 5, 33), float("nan"), device=TEST_DEVICE)
    run_decode(4, 2, 32, [12, 3], 5, torch.float32, scratch=scratch)


def small_extend_args() -> dict[str, torch.Tensor]:
    return {
        "q_extend": torch.zeros(3, 4, 16),
        "k_extend": torch.zeros(3, 2, 16),
        "v_extend": torch.zeros(3, 2, 16),
        "o_extend": torch.zeros(3, 4, 16),
        "k_buffer": torch.zeros(10, 2, 16),
        "v_buffer": torch.zeros(10, 2, 16),
        "req_to_token": torch.zeros(2, 8, dtype=torch.int32),
        "req_pool_indices": torch.tensor([1]),
        "seq_lens": torch.tensor([5]),
        "extend_seq_lens": torch.tensor([3]),
        "extend_start_loc": torch.tensor([0]),
    }


@pytest.mark.parametrize(
    ("name", "bad", "message"),
    [
        ("k_buffer", torch.zeros(10, 2, 8), "k_buffer must have shape"),
        ("k_extend", torch.zeros(3, 4, 16), "k_extend must have shape"),
        ("o_extend", torch.zeros(2, 4, 16), "o_extend must have shape"),
        ("q_extend", torch.zeros(3, 3, 16), "multiple of num_kv_heads"),
        ("v_buffer", torch.zeros(9, 2, 16), "v_buffer must have shape"),
        ("k_extend", torch.zeros(3, 16, 2).transpose(1, 2), "contiguous"),
        ("v_extend", torch.zeros(3, 2, 16, dtype=torch.float16), "one dtype"),
        ("req_to_token", torch.zeros(2, 8, dtype=torch.int64), "int32"),
        ("seq_lens", torch.tensor([5, 5]), "seq_lens must be one"),
        ("extend_start_loc", torch.tensor([0.0]), "extend_start_loc must be one"),
        ("extend_start_loc", torch.zeros(1, dtype=torch.int64, device="meta"), "one device"),
    ],
)
def test_extend_rejects_bad_arguments(name: str, bad: torch.Tensor, message: str) -> None:
    args = small_extend_args()
    args[name] = bad
    with pytest.raises(ValueError, match=message):
        extend_attention_fwd(**args, sm_scale=0.25)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "bad", "message"),
    [
        ("q", torch.zeros(2, 4), "q must be"),
        ("o", torch.zeros(2, 4, 8), "o must have"),
        ("k_buffer", torch.zeros(10, 2, 8), "k_buffer must be"),
        ("v_buffer", torch.zeros(10, 1, 16), "v_buffer"),
        ("k_buffer", torch.zeros(10, 3, 16), "multiple of num_kv_heads"),
        ("o", torch.zeros(2, 16, 4).transpose(1, 2), "contiguous"),
        ("q", torch.zeros(2, 4, 16, dtype=torch.float16), "one dtype"),
        ("req_to_token", torch.zeros(8, dtype=torch.int32), "req_to_token"),
        ("req_pool_indices", torch.tensor([0]), "req_pool_indices must be one"),
        ("seq_lens", torch.tensor([1.0, 2.0]), "seq_lens must be one"),
        ("seq_lens", torch.ones(2, dtype=torch.int64, device="meta"), "one device"),
        ("num_kv_splits", 0, "num_kv_splits"),
        ("scratch", torch.zeros(2, 4, 8, 16), "scratch must be"),
        ("scratch", torch.zeros(2, 4, 8, 17, dtype=torch.float16), "scratch must be"),
    ],
)
def test_decode_rejects_bad_arguments(name: str, bad: torch.Tensor | int, message: str) -> None:
    args: dict[str, torch.Tensor | int | None] = {
        "q": torch.zeros(2, 4, 16),
        "k_buffer": torch.zeros(10, 2, 16),
        "v_buffer": torch.zeros(10, 2, 16),
        "o": torch.zeros(2, 4, 16),
        "req_to_token": torch.zeros(2, 8, dtype=torch.int32),
        "req_pool_indices": torch.tensor([1, 0]),
        "seq_lens": torch.tensor([3, 1]),
        "num_kv_splits": 8,
        "scratch": None,
    }
    args[name] = bad
    with pytest.raises(ValueError, match=message):
        decode_attention_fwd(**args, sm_scale=0.25)  # type: ignore[arg-type]


# Compiles every kernel for an sm_90 GPU (to a cubin) with the launchers' GPU tile sizes (see
# extend_attention._tile_sizes; float16 lowers like bfloat16 and is left out for time), in a
# fresh interpreter-free process: the interpreter accepts programs the compiler rejects.
COMPILE_FOR_GPU = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from srt.kernels.triton import decode_attention as da, extend_attention as ea

INDEX = {"req_to_token_ptr": "*i32", "req_pool_indices_ptr": "*i64", "seq_lens_ptr": "*i32",
         "extend_seq_lens_ptr": "*i32", "extend_start_loc_ptr": "*i64", "scratch_ptr": "*fp32"}
for dtype, precision in (("bf16", None), ("fp32", "ieee")):
    block = 64 if dtype == "bf16" else 32
    for fn, consts in (
        (ea._extend_attention_kernel,
         dict(GROUP=4, BLOCK_M=block, BLOCK_N=block, BLOCK_D=128, PRECISION=precision)),
        (da._decode_stage1_kernel,
         dict(GROUP=4, NUM_SPLITS=8, BLOCK_H=16, BLOCK_N=64, BLOCK_D=128, PRECISION=precision)),
        (da._decode_stage2_kernel, dict(NUM_SPLITS=8, BLOCK_D=128)),
    ):
        signature = {
            name: "constexpr" if name in consts
            else INDEX.get(name, "*" + dtype) if name.endswith("_ptr")
            else "fp32" if name == "qk_scale" else "i32"
            for name in fn.arg_names
        }
        constexprs = {(fn.arg_names.index(k),): v for k, v in consts.items()}
        compiled = triton.compile(
            ASTSource(fn, signature, constexprs=constexprs),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": 4, "num_stages": 2},
        )
        assert compiled.asm["cubin"], (dtype, fn)
print("compiled")
"""


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the other tests compile them")
def test_kernels_compile_for_gpu() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", COMPILE_FOR_GPU], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "compiled"
