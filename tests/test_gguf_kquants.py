"""srt's K-quant encoders (`srt.testing.gguf_kquants`) write blocks that the `gguf` package (ggml's
layouts) decodes to the input, within the error the module doc derives, and exactly where the
input is made of values the format holds."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from srt.testing.gguf_kquants import K_QUANTS, SUPER_BLOCK, quantize

Q = GGMLQuantizationType
# type -> (weights per sub-block, largest value, largest integer scale); Q6_K's values are signed.
FORMATS = {
    Q.Q2_K: (16, 3, 15),
    Q.Q4_K: (32, 15, 63),
    Q.Q5_K: (32, 31, 63),
    Q.Q6_K: (16, 31, 127),
}
# float16's rounding up of d and dmin: at most one part in 2^10 of them.
F16_UP = 1 + 2**-10


def sample(rng: np.random.Generator) -> np.ndarray:
    """Rows of weights as models hold them, one shifted to all positive (its mins are 0), one of
    zeros, one with a sub-block far larger than the rest (the others get small integer scales)."""
    x = rng.standard_normal((6, 2 * SUPER_BLOCK)).astype(np.float32)
    x[1] += 4
    x[2] = 0
    x[3, :16] *= 50
    return x


def error_bound(x: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """Each value's bound from the module doc: half its sub-block's step, which the rounding up of
    the integer scale widens by at most d, plus half of dmin (for Q6_K, whose zero is fixed, the
    step alone)."""
    size, q_max, scale_max = FORMATS[qtype]
    subs = x.reshape(-1, SUPER_BLOCK // size, size)
    if qtype == Q.Q6_K:
        steps = np.abs(subs).max(axis=2) / q_max
        mins = np.zeros_like(steps)
    else:
        low = np.minimum(subs.min(axis=2), 0)
        steps = (subs.max(axis=2) - low) / q_max
        mins = -low
    d = steps.max(axis=1, keepdims=True) / scale_max * F16_UP
    dmin = mins.max(axis=1, keepdims=True) / scale_max * F16_UP
    bound = (steps + d) / 2 + dmin / 2
    return np.repeat(bound, size, axis=1).reshape(x.shape)


@pytest.mark.parametrize("qtype", K_QUANTS, ids=lambda t: t.name)
def test_blocks_decode_to_the_input_within_the_format_s_error(qtype: GGMLQuantizationType) -> None:
    x = sample(np.random.default_rng(0))
    blocks = quantize(x, qtype)
    assert blocks.dtype == np.uint8
    assert blocks.shape == (6, 2 * (blocks.shape[1] // 2))
    decoded = dequantize(blocks, qtype)
    assert decoded.shape == x.shape
    error = np.abs(decoded - x)
    # float32 products and sums of the decoder: a few parts in 10^7 of each row's largest value
    slack = 1e-6 * np.abs(x).max(axis=1, keepdims=True)
    bound = error_bound(x, qtype) + slack
    assert (error <= bound).all()
    assert (decoded[2] == 0).all()
    # The bound is not vacuous: somewhere the error comes close to it.
    assert (error[bound > 0] / bound[bound > 0]).max() > 0.4


def representable(rng: np.random.Generator, qtype: GGMLQuantizationType) -> np.ndarray:
    """Values the format holds exactly: d = 2^-6 and dmin = 2^-7 (float16 exactly), integer
    scales and mins with the largest of each in every super-block, and each sub-block's values
    spanning the whole range (so the encoder must find these same integers again)."""
    size, q_max, scale_max = FORMATS[qtype]
    blocks, subs = 4, SUPER_BLOCK // size
    sc = rng.integers(0, scale_max + 1, (blocks, subs, 1))
    sc[:, 0] = scale_max
    if qtype == Q.Q6_K:
        q = rng.integers(-q_max, q_max + 1, (blocks, subs, size))  # -32 the encoder never uses
        q[:, :, 0] = np.where(rng.random((blocks, subs)) < 0.5, q_max, -q_max)
        values = 2.0**-6 * sc * q
    else:
        m = rng.integers(0, scale_max + 1, (blocks, subs, 1))
        m[:, 1] = scale_max
        q = rng.integers(0, q_max + 1, (blocks, subs, size))
        q[:, :, 0], q[:, :, 1] = 0, q_max
        values = 2.0**-6 * sc * q - 2.0**-7 * m
    return values.astype(np.float32).reshape(2, 2 * SUPER_BLOCK)


@pytest.mark.parametrize("qtype", K_QUANTS, ids=lambda t: t.name)
def test_values_the_format_holds_decode_exactly(qtype: GGMLQuantizationType) -> None:
    x = representable(np.random.default_rng(1), qtype)
    blocks = quantize(x, qtype)
    np.testing.assert_array_equal(dequantize(blocks, qtype), x)
    # and decoded blocks encode to the same bytes (nothing left to round)
    np.testing.assert_array_equal(quantize(dequantize(blocks, qtype), qtype), blocks)


def test_what_is_not_whole_super_blocks_of_a_k_quant_is_refused() -> None:
    with pytest.raises(ValueError, match="not whole super-blocks of 256"):
        quantize(np.zeros((2, 384), np.float32), Q.Q4_K)
    with pytest.raises(ValueError, match="Q4_0 is not one of Q2_K, Q4_K, Q5_K, Q6_K"):
        quantize(np.zeros((2, 256), np.float32), Q.Q4_0)
