"""Every environment knob of srt, read in this one place. All names start with `SRT_`."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where srt keeps prepared models (`SRT_CACHE_DIR`, default `~/.cache/srt`)."""
    configured = os.environ.get("SRT_CACHE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "srt"


def cpu_kv_cache_gb() -> float:
    """KV cache budget on CPU when `--max-total-tokens` is not given (`SRT_CPU_KV_CACHE_GB`)."""
    return float(os.environ.get("SRT_CPU_KV_CACHE_GB", "2"))


def ring_capacity() -> int:
    """Bytes in the data area of each inter-process ring (`SRT_RING_CAPACITY`, default 16 MiB;
    a power of two, at least 64). A message longer than a ring goes through it in parts, so this
    bounds no message: it trades memory for fewer waits on large ones."""
    return int(os.environ.get("SRT_RING_CAPACITY", 16 << 20))


def ring_spin_us() -> float:
    """Microseconds a ring end that just ran out of work polls before it sleeps on its doorbell
    (`SRT_RING_SPIN_US`, default 20; 0 turns spinning off). Idle ends spin once, then sleep."""
    return float(os.environ.get("SRT_RING_SPIN_US", "20"))


def check_invariants() -> bool:
    """Whether the scheduler checks its KV bookkeeping after every step, not only when it goes
    idle (`SRT_CHECK_INVARIANTS=1`; tests set it)."""
    return os.environ.get("SRT_CHECK_INVARIANTS", "0") == "1"


def cpu_isa() -> str | None:
    """The highest instruction set srt's CPU kernels may use (`SRT_CPU_ISA`: `scalar`, `avx2`,
    `avx2_vnni` (AVX2 with AVX-VNNI), `avx512`, `avx512_vnni` or `avx512_bf16`; unset: the best
    the CPU has). Lowering it runs the slower paths on a faster machine, to test their results
    (not that they avoid the faster instructions: the emulated-CPU tests prove that); below
    `avx512_bf16`, `--dtype auto` also picks float32, as on a CPU without native bf16 products,
    below `avx512_vnni` quantized weights take the AVX2 integer kernels (with AVX-VNNI's products
    under `avx2_vnni`), and below `avx2` the linear layers take PyTorch's product."""
    return os.environ.get("SRT_CPU_ISA") or None


def fused_decode() -> bool:
    """Whether decode steps of packed quantized layers run as one Rust call
    (`model_executor/cpu_decode.py`; `SRT_FUSED_DECODE=0` runs the layers one by one, to
    compare: both give the same bits)."""
    return os.environ.get("SRT_FUSED_DECODE", "1") != "0"


def disable_kernel_plan_cache() -> bool:
    """Whether the kernel plans measured at start-up are neither read from nor written to the
    cache directory (`SRT_DISABLE_KERNEL_PLAN_CACHE=1`, as vLLM's `VLLM_DISABLE_COMPILE_CACHE`;
    `kernels/cpu/plan_cache.py`): every start then measures them again."""
    return os.environ.get("SRT_DISABLE_KERNEL_PLAN_CACHE", "0") == "1"
