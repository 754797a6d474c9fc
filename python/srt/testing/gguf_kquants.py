"""Encoders for ggml's K-quant blocks (Q2_K, Q4_K, Q5_K, Q6_K), for deterministic test fixtures.

Why: the `gguf` package dequantizes every type but quantizes only the 32-weight formats, and the
files people download are K-quants. These write ggml's exact block layouts (the ones
`gguf.quants.dequantize` and llama.cpp read) with a plain quantizer, not llama.cpp's
error-minimizing search: fixtures need known bytes and a stated error bound, not the best rounding.

Every K-quant cuts a row into super-blocks of 256 weights and those into sub-blocks that share a
scale. The affine types (Q2_K: 16 sub-blocks of 16, 2-bit values, 4-bit scales and mins; Q4_K and
Q5_K: 8 of 32, 4- or 5-bit values, 6-bit scales and mins) decode a value as
`d * sc * q - dmin * m`; Q6_K (16 of 16, 6-bit values, int8 scales) as `d * sc * (q - 32)`.
Here each sub-block's step is its range over the largest value (its min at most 0, as ggml's;
for Q6_K, its largest magnitude over 31, leaving -32 unused), `d` and `dmin` are the largest step
and min over the largest integer scale, in float16 rounded up, and each integer scale is its step
over `d` rounded up, so that no value leaves the range: a value then errs by at most half its
sub-block's step `d * sc` plus half of `dmin` (the rounding of its min), which
`tests/test_gguf_kquants.py` checks.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
SUPER_BLOCK = 256
# type -> (weights per sub-block, largest value, largest integer scale and min)
_AFFINE = {Q.Q2_K: (16, 3, 15), Q.Q4_K: (32, 15, 63), Q.Q5_K: (32, 31, 63)}
_Q6_K_SUB_BLOCK, _Q6_K_Q, _Q6_K_SCALE = 16, 31, 127
K_QUANTS = (*_AFFINE, Q.Q6_K)


def quantize(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """`values` ([..., columns], columns a multiple of 256) as `qtype` blocks: uint8
    [..., columns / 256 * bytes per block], the shape `gguf.quants.quantize` gives."""
    if qtype not in K_QUANTS:
        raise ValueError(f"{qtype.name} is not one of {', '.join(t.name for t in K_QUANTS)}")
    if values.shape[-1] % SUPER_BLOCK:
        raise ValueError(f"rows of {values.shape[-1]} weights are not whole super-blocks of 256")
    blocks = np.asarray(values, dtype=np.float32).reshape(-1, SUPER_BLOCK)
    packed = _q6_k(blocks) if qtype == Q.Q6_K else _affine(blocks, qtype)
    assert packed.shape[1] == GGML_QUANT_SIZES[qtype][1]
    return packed.reshape(*values.shape[:-1], -1)


def _f16_at_least(x: np.ndarray) -> np.ndarray:
    """`x` in float16, rounded up where rounding to nearest went below it."""
    h = x.astype(np.float16)
    low = h.astype(np.float32) < x
    h[low] = np.nextafter(h[low], np.float16(np.inf))
    return h


def _integer_scales(steps: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """The float16 super-block scale of `steps` [blocks, sub-blocks] (their largest over `top`)
    and each step as an integer multiple of it, rounded up (0 where the super-block is 0)."""
    d = _f16_at_least(steps.max(axis=1) / top)
    wide = d.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        scales = np.where(wide > 0, np.ceil(steps / wide), 0)
    return d, np.minimum(scales, top).astype(np.uint8)


def _affine(blocks: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    size, q_max, scale_max = _AFFINE[qtype]
    subs = blocks.reshape(len(blocks), -1, size)
    low = np.minimum(subs.min(axis=2), 0)
    d, sc = _integer_scales((subs.max(axis=2) - low) / q_max, scale_max)
    dmin = _f16_at_least((-low).max(axis=1) / scale_max)
    wide_min = dmin.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        m = np.where(wide_min > 0, np.rint(-low / wide_min), 0).astype(np.uint8)
    step = (d.astype(np.float32)[:, None] * sc)[:, :, None]
    offset = (wide_min * m)[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(step > 0, np.rint((subs + offset) / step), 0)
    q = np.clip(q, 0, q_max).astype(np.uint8).reshape(len(blocks), SUPER_BLOCK)
    halves = (d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2))
    if qtype == Q.Q2_K:
        return np.concatenate([sc | (m << 4), _crumbs(q), *halves], axis=1)
    nibbles = _nibbles(q & 0x0F)
    packed_scales = _six_bit_scales(sc, m)
    if qtype == Q.Q4_K:
        return np.concatenate([*halves, packed_scales, nibbles], axis=1)
    return np.concatenate([*halves, packed_scales, _high_bits(q >> 4), nibbles], axis=1)


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    subs = blocks.reshape(len(blocks), -1, _Q6_K_SUB_BLOCK)
    d, sc = _integer_scales(np.abs(subs).max(axis=2) / _Q6_K_Q, _Q6_K_SCALE)
    step = (d.astype(np.float32)[:, None] * sc)[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(step > 0, np.rint(subs / step), 0)
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(len(blocks), 2, 4, 32)
    # Each half of 128: its low nibbles, values i and 64 + i in byte i of 64; its top two bits,
    # values i, 32 + i, 64 + i and 96 + i in byte i of 32.
    low = q & 0x0F
    ql = (low[:, :, 0:2] | (low[:, :, 2:4] << 4)).reshape(len(blocks), 128)
    high = (q >> 4).astype(np.uint8)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    return np.concatenate(
        [ql, qh.reshape(len(blocks), 64), sc.view(np.uint8), d.view(np.uint8).reshape(-1, 2)],
        axis=1,
    )


def _nibbles(q: np.ndarray) -> np.ndarray:
    """4-bit values [blocks, 256] as Q4_K/Q5_K hold them: each run of 64 in 32 bytes, values i
    and 32 + i in byte i's low and high nibble."""
    runs = q.reshape(len(q), 4, 2, 32)
    return (runs[:, :, 0] | (runs[:, :, 1] << 4)).reshape(len(q), 128)


def _crumbs(q: np.ndarray) -> np.ndarray:
    """2-bit values [blocks, 256] as Q2_K holds them: each half of 128 in 32 bytes, values i,
    32 + i, 64 + i and 96 + i in byte i's bits 0-1, 2-3, 4-5 and 6-7."""
    runs = q.reshape(len(q), 2, 4, 32)
    packed = runs[:, :, 0] | (runs[:, :, 1] << 2) | (runs[:, :, 2] << 4) | (runs[:, :, 3] << 6)
    return packed.reshape(len(q), 64)


def _high_bits(bits: np.ndarray) -> np.ndarray:
    """Q5_K's fifth bits [blocks, 256]: value 32 * k + i in bit k of byte i of 32."""
    runs = bits.reshape(len(bits), 8, 32)
    return np.bitwise_or.reduce(runs << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)


def _six_bit_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and eight 6-bit mins in 12 bytes: bytes 0-3 hold scales 0-3 and the
    top two bits of scales 4-7, bytes 4-7 the same of the mins, bytes 8-11 the low nibbles of
    scale and min 4-7."""
    return np.concatenate(
        [
            sc[:, :4] | ((sc[:, 4:] >> 4) << 6),
            m[:, :4] | ((m[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4),
        ],
        axis=1,
    )
