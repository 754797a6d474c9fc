"""Every default that depends on the device, resolved in one place (`resolve_device_defaults`).

`ServerArgs` leaves these fields unset (None, or "auto") because the main process, which has no
torch, cannot know the device. The scheduler process resolves them once, when its model runner
starts; the scheduler, the runner and everything under them read only the resolved values.
"""

from __future__ import annotations

import logging

import torch

from srt import envs
from srt.kernels.cpu import cpu_kernels
from srt.layers.attention.registry import resolve_attention_backend
from srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

DEFAULT_MAX_RUNNING_REQUESTS = 256
DEFAULT_MEM_FRACTION_STATIC = 0.85  # of GPU memory, for weights and KV cache (CUDA only)
# --chunked-prefill-size when not given. On the CPU, GEMMs of a few thousand rows run faster per
# row than larger ones (their activations stay in cache): the 7,511 prompt tokens of
# bench_offline_throughput's random workload prefilled in 18.6 s in steps of at most 4,096 tokens
# and in 21.6 s in one step of 7,511 (SmolLM2, three alternating runs each). From 2,048 to 4,096
# a token costs the same (SmolLM2 Q4_1, one thread: 1.09-1.14 ms per token in passes of 8 x 256,
# 1.06-1.09 in passes of 16 x 256), and the smaller step lets one long prompt finish its prefill
# before the next one starts instead of two finishing together a whole step later.
CUDA_CHUNKED_PREFILL_SIZE = 8192
CPU_CHUNKED_PREFILL_SIZE = 2048


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but CUDA is not available")
    return torch.device(name)


def default_dtype(device: torch.device) -> str:
    """`--dtype auto`: bf16 on CUDA and on CPUs that multiply bf16 natively, else float32."""
    return default_dtype_and_reason(device)[0]


def default_dtype_and_reason(device: torch.device) -> tuple[str, str]:
    """`--dtype auto`'s choice on `device`, and why.

    On the CPU the choice follows the instructions, not a measurement: with AVX-512 BF16 or
    AMX-BF16, oneDNN's bf16 products run at the float32 rate or better and read half the bytes
    (decode reads every weight once per step), and srt's bf16 kernels run; without them, bf16
    products are emulated by widening and are slower than float32. The features come from CPUID
    (the Rust kernels' check, which also asks whether the OS saves the registers), not from
    /proc/cpuinfo, so they are the ones the kernels dispatch on; `SRT_CPU_ISA` below
    `avx512_bf16` counts as a CPU without them."""
    if device.type == "cuda":
        return "bfloat16", "CUDA"
    active, best = cpu_kernels.isa()
    if cpu_kernels.native_bf16_matmul():
        features = "AMX-BF16" if cpu_kernels.amx_bf16() else "AVX-512 BF16"
        return "bfloat16", f"the CPU multiplies bf16 natively ({features})"
    if active != best:
        return "float32", f"SRT_CPU_ISA={envs.cpu_isa()} caps the CPU kernels at {active}"
    return "float32", f"the CPU has no native bf16 products (AVX-512 BF16 or AMX); best: {best}"


def resolve_device_defaults(args: ServerArgs, device: torch.device | None = None) -> ServerArgs:
    """`args` with the device (`device`, else `resolve_device(args.device)`) and every default
    that depends on it filled in: `device`, `dtype` (auto: `default_dtype`, logged with its
    reason),
    `attention_backend` (refused here, before anything loads, when it cannot run on the device),
    `chunked_prefill_size`, `max_running_requests` and `mem_fraction_static`. Resolving resolved
    arguments changes nothing."""
    if device is None:
        device = resolve_device(args.device)
    cuda = device.type == "cuda"
    dtype = args.dtype
    if dtype == "auto":
        dtype, reason = default_dtype_and_reason(device)
        logger.info("--dtype auto: %s (%s)", dtype, reason)
    return args.replace(
        device=device.type,
        dtype=dtype,
        attention_backend=resolve_attention_backend(args.attention_backend, device),
        chunked_prefill_size=args.chunked_prefill_size
        or (CUDA_CHUNKED_PREFILL_SIZE if cuda else CPU_CHUNKED_PREFILL_SIZE),
        max_running_requests=args.max_running_requests or DEFAULT_MAX_RUNNING_REQUESTS,
        mem_fraction_static=args.mem_fraction_static or DEFAULT_MEM_FRACTION_STATIC,
    )
