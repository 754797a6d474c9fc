"""The engines `bench.py` runs side by side: srt and its peers in their default configurations,
the extra ones `--srt-config` and `--engine-config` add (flags added to an engine's command, an
option named again replacing its own), and the choice of which run."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Engine:
    name: str
    label: str
    kind: str
    """srt, vllm or llama: which server it runs."""
    flags: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    weights: str = "hf"
    """hf (the Hugging Face directory; srt: its default model), or a GGUF file: f16, q4_1 or
    q4_k_m (`install.Models.gguf`)."""


def cpu_list(cpus: Sequence[int]) -> str:
    """CPU ids as vLLM's `VLLM_CPU_OMP_THREADS_BIND` takes them: a range when contiguous."""
    ordered = sorted(cpus)
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(map(str, ordered))


def vllm_default_dtype() -> tuple[str, str]:
    """vLLM's `--dtype` unless an engine's flags say otherwise, and why: srt's own choice for
    `--dtype auto` on this CPU (`srt.model_executor.resolve`): bf16 where the CPU multiplies it
    natively (AVX-512 BF16 or AMX-BF16), else float32, where vLLM-CPU's bf16 is emulated (on a
    Zen 3 it served a fifth of its float32 throughput). `SRT_CPU_ISA` below `avx512_bf16` counts
    as a CPU without them, as for srt, so a capped run measures vLLM as on such a CPU."""
    import torch

    from srt.model_executor.resolve import default_dtype_and_reason

    return default_dtype_and_reason(torch.device("cpu"))


def peer_engines(cpus: Sequence[int], vllm_dtype: str) -> list[Engine]:
    """The peers in their default configurations, vLLM in `vllm_dtype`."""
    dtype = {"bfloat16": "bf16"}.get(vllm_dtype, vllm_dtype)
    return [
        Engine("vllm", f"vLLM-CPU {dtype}, default", "vllm", ("--dtype", vllm_dtype)),
        Engine(
            "vllm-all-cores",
            f"vLLM-CPU {dtype}, all cores computing",
            "vllm",
            ("--dtype", vllm_dtype),
            env={"VLLM_CPU_OMP_THREADS_BIND": cpu_list(cpus), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"},
        ),
        Engine("llama-f16", "llama-server f16", "llama", weights="f16"),
        Engine("llama-q4_1", "llama-server Q4_1", "llama", weights="q4_1"),
        Engine("llama-q4_k_m", "llama-server Q4_K_M", "llama", weights="q4_k_m"),
    ]


def _is_option(word: str) -> bool:
    return word.startswith("-") and not word[1:2].isdigit()


def replace_options(flags: Sequence[str], given: Sequence[str]) -> list[str]:
    """`flags` followed by `given`, less each option of `flags` that `given` names again (as
    spelled, `--opt VALUE` or `--opt=VALUE`; its value goes with it): a flag given for an engine
    replaces the benchmark's default instead of repeating it."""
    named = {word.split("=", 1)[0] for word in given if _is_option(word)}
    kept: list[str] = []
    i = 0
    while i < len(flags):
        word = flags[i]
        i += 1
        if not (_is_option(word) and word.split("=", 1)[0] in named):
            kept.append(word)
        elif "=" not in word and i < len(flags) and not _is_option(flags[i]):
            i += 1  # its value
    return [*kept, *given]


def configured_engines(
    available: Sequence[Engine], configs: Sequence[str], option: str = "--engine-config"
) -> list[Engine]:
    """One engine per `ENGINE:NAME="FLAGS"`: ENGINE's server (its flags, environment and
    weights) with FLAGS added, named ENGINE-NAME; an option FLAGS names again replaces ENGINE's
    and the benchmark's default (`replace_options`)."""
    by_name = {e.name: e for e in available}
    engines: list[Engine] = []
    for config in configs:
        target, sep, flags = config.partition("=")
        base_name, colon, name = target.partition(":")
        if not sep or not colon or not name.strip():
            raise ValueError(f'{option} takes ENGINE:NAME="FLAGS", got {config!r}')
        base = by_name.get(base_name.strip())
        if base is None:
            raise ValueError(
                f"{option} {config!r}: no engine {base_name!r}; choose among {sorted(by_name)}"
            )
        words = shlex.split(flags)
        engine = dataclasses.replace(
            base,
            name=f"{base.name}-{name.strip()}",
            label=f"{base.name} `{flags.strip()}`",
            flags=tuple(replace_options(base.flags, words)),
        )
        if engine.name in by_name or engine.name in {e.name for e in engines}:
            raise ValueError(f"{option} {config!r}: engine {engine.name} is named twice")
        engines.append(engine)
    return engines


def srt_engines(configs: Sequence[str]) -> list[Engine]:
    """`srt` (no tuning flags), one engine per `NAME=FLAGS` of `--srt-config` (the
    `--engine-config` `srt:NAME=FLAGS`), and `srt-q4_k_m`: srt on the Q4_K_M file that
    `llama-q4_k_m` serves."""
    srt = Engine("srt", "srt default", "srt")
    for config in configs:
        name, sep, _ = config.partition("=")
        if not sep or not name.strip():
            raise ValueError(f'--srt-config takes NAME="FLAGS", got {config!r}')
    derived = configured_engines([srt], [f"srt:{c}" for c in configs], "--srt-config")
    return [srt, *derived, Engine("srt-q4_k_m", "srt Q4_K_M", "srt", weights="q4_k_m")]


def all_engines(
    cpus: Sequence[int], vllm_dtype: str, srt_configs: Sequence[str], configs: Sequence[str]
) -> list[Engine]:
    """srt, one engine per `--srt-config`, the peers, one engine per `--engine-config`."""
    builtin = [*srt_engines(srt_configs), *peer_engines(cpus, vllm_dtype)]
    return [*builtin, *configured_engines(builtin, configs)]


def select_engines(available: Sequence[Engine], wanted: str | None) -> list[Engine]:
    """The engines `--engines` names, in its order (all when it is not given)."""
    if wanted is None:
        return list(available)
    by_name = {e.name: e for e in available}
    names = [n.strip() for n in wanted.split(",") if n.strip()]
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"unknown engines {unknown}; choose among {sorted(by_name)}")
    if len(set(names)) != len(names):
        raise ValueError(f"--engines names an engine twice: {wanted}")
    return [by_name[n] for n in names]
