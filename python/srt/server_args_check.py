"""The checks of `ServerArgs` (its `__post_init__` runs `validate`): choices, ranges, formats,
and fields that cannot work together, each refused with a `ServerArgsError` naming its flag; and
the parsers those checks share with the rest of srt."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from srt.server_args import ServerArgs

_ORIGIN = re.compile(r"https?://[^/\s:]+(:\d+)?")
# `managers.metric_names.PREFIX_PATTERN`, spelled out so that parsing a command line imports no
# prometheus_client; tests/test_metric_names.py holds them equal.
_METRICS_PREFIX = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*")
_HOST_PORT = re.compile(r"[A-Za-z0-9.-]+:\d{1,5}")


class ServerArgsError(ValueError):
    """A field holds a value it cannot take; `flag` names it as the CLI spells it."""

    def __init__(self, field_name: str, message: str) -> None:
        self.flag = flag_of(field_name)
        super().__init__(f"argument {self.flag}: {message}")


def flag_of(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def validate(args: ServerArgs) -> None:
    """Raises `ServerArgsError` for the first field of `args` that is out of its choices or
    range, malformed, or at odds with another."""
    for f in dataclasses.fields(args):
        choices = f.metadata["choices"]
        value = getattr(args, f.name)
        if choices and value is not None and value not in choices:
            raise ServerArgsError(
                f.name, f"invalid choice {value!r} (choose from {', '.join(choices)})"
            )
    _check_range(args, "port", lo=1, hi=65535)
    _check_range(args, "metrics_port", lo=1, hi=65535)
    _check_grpc_mode(args)
    _check_range(args, "tp_size", lo=1)
    _check_parallelism(args)
    _check_range(args, "context_length", lo=1)
    _check_range(args, "max_total_tokens", lo=1)
    _check_range(args, "max_running_requests", lo=1)
    _check_range(args, "max_prefill_tokens", lo=1)
    _check_range(args, "max_queued_requests", lo=1)
    _check_range(args, "max_request_bytes", lo=1)
    _check_range(args, "graceful_shutdown_timeout", lo=0)
    _check_range(args, "page_size", lo=1)
    _check_range(args, "cuda_graph_max_bs", lo=1)
    _check_range(args, "stream_interval", lo=1)
    for name in (
        "max_n",
        "max_client_batch_size",
        "max_samples_per_request",
        "max_stop_sequence_length",
    ):
        _check_range(args, name, lo=1)
    for name in ("max_stop_sequences", "max_logprobs", "max_logit_bias_entries"):
        _check_range(args, name, lo=0)
    _check_range(args, "watchdog_timeout", lo=0, open_lo=True)
    if args.chunked_prefill_size != -1:
        _check_range(args, "chunked_prefill_size", lo=1)
    for origin in args.allowed_origins:
        if origin != "*" and not _ORIGIN.fullmatch(origin):
            raise ServerArgsError(
                "allowed_origins", f"{origin!r} is not an origin like https://host[:port]"
            )
    for host in args.allowed_hosts:
        if host != "*" and not _HOST.fullmatch(host):
            raise ServerArgsError(
                "allowed_hosts", f"{host!r} is not a host name or address (without a port)"
            )
    if args.cpu_omp_threads_bind not in ("auto", "nobind"):
        try:
            parse_cpu_list(args.cpu_omp_threads_bind)
        except ValueError as e:
            raise ServerArgsError("cpu_omp_threads_bind", str(e)) from None
    if not _METRICS_PREFIX.fullmatch(args.metrics_name_prefix):
        raise ServerArgsError(
            "metrics_name_prefix",
            f"{args.metrics_name_prefix!r} is not a metric name prefix "
            "(letters, digits and _, not starting with a digit)",
        )
    fraction = args.mem_fraction_static
    if fraction is not None and not (math.isfinite(fraction) and 0 < fraction <= 1):
        raise ServerArgsError("mem_fraction_static", f"must be in (0, 1], got {fraction}")
    if (
        args.quantization == "gguf"
        and args.model_path is not None
        and split_gguf_path(args.model_path)[1] is None
    ):
        raise ServerArgsError("quantization", "gguf needs a GGUF file as --model-path")


def split_gguf_path(model_path: str) -> tuple[str, str | None]:
    """(directory or hub id, GGUF file name or None) for a `--model-path` or `--tokenizer-path`."""
    path = Path(model_path)
    if path.suffix == ".gguf":
        return str(path.parent), path.name
    return model_path, None


def parse_cpu_list(spec: str) -> list[int]:
    """The CPUs of a list like `0-3,6`, in its order, each once."""
    cpus: list[int] = []
    for part in spec.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{spec!r} is not auto, nobind or a CPU list like 0-3,6")
        lo, hi = int(first), int(last) if dash else int(first)
        if hi < lo:
            raise ValueError(f"the range {part.strip()!r} of {spec!r} runs backwards")
        cpus.extend(cpu for cpu in range(lo, hi + 1) if cpu not in cpus)
    return cpus


def _check_parallelism(args: ServerArgs) -> None:
    _check_range(args, "nnodes", lo=1)
    _check_range(args, "node_rank", lo=0, hi=args.nnodes - 1)
    if args.tp_size % args.nnodes:
        raise ServerArgsError(
            "tp_size", f"{args.tp_size} ranks do not split evenly over --nnodes {args.nnodes}"
        )
    addr = args.dist_init_addr
    if addr is not None and not _HOST_PORT.fullmatch(addr):
        raise ServerArgsError("dist_init_addr", f"{addr!r} is not HOST:PORT")
    if args.nnodes > 1 and addr is None:
        raise ServerArgsError("dist_init_addr", "--nnodes > 1 needs node 0's HOST:PORT")


def _check_grpc_mode(args: ServerArgs) -> None:
    """The gRPC entrance serves no HTTP routes: its metrics need a port of their own."""
    if not args.grpc_mode:
        if args.metrics_port is not None:
            raise ServerArgsError("metrics_port", "is for --grpc-mode (HTTP serves /metrics)")
        return
    if args.enable_metrics and args.metrics_port is None:
        raise ServerArgsError(
            "metrics_port", "--grpc-mode with --enable-metrics needs a port to serve /metrics on"
        )
    if args.metrics_port is not None and args.metrics_port == args.port:
        raise ServerArgsError("metrics_port", "must differ from --port")


def _check_range(
    args: ServerArgs,
    name: str,
    *,
    lo: float,
    hi: float = math.inf,
    open_lo: bool = False,
) -> None:
    value = getattr(args, name)
    if value is None:
        return
    too_low = value <= lo if open_lo else value < lo
    if not math.isfinite(value) or too_low or value > hi:
        bound = f"> {lo}" if open_lo else f">= {lo}"
        if hi != math.inf:
            bound = f"in [{lo}, {hi}]"
        raise ServerArgsError(name, f"must be {bound}, got {value}")
