"""sglang-router in front of `srt-serve` replicas, for the tests and benches of data parallelism.

    with running_router([a.url, b.url], "cache_aware") as router:
        requests go to router.url

The router listens on 127.0.0.1, on a free port (its Prometheus exporter on another); it
returns once `/readiness` counts every worker healthy and, on exit, is stopped (SIGTERM, then
killed if it hangs). Workers may be HTTP (`http://...`) or gRPC (`grpc://...`, replicas started
with `--grpc-mode`: the router then tokenizes, with the tokenizer the workers name, or the one
of `model_path` when given). Needs `pip install sglang-router`.

In gRPC mode sglang-router 0.3.2 also loads, as it starts, OpenAI's `o200k_base.tiktoken` (for
gpt-oss's Harmony format, whatever the model), which it would download from a host this
project's machines cannot reach: `running_router` points it at the copy inside the tiktoken-rs
crate's sources, which `cargo fetch` brings (`FETCH_VOCAB`, a step of scripts/test.sh), and the
router checks that copy against the file's SHA-256.

Failover (`FAILOVER_FLAGS`, docs/scale-out.md's recipe): the health check runs every second and
takes one failure to mark a worker down, and a failed request is retried with backoffs that add
up to well over that (0.1 + 0.2 + 0.4 + 0.8 + 1.6 s), so a retry finds the stopped worker out of
the rotation whatever the policy. The router's default retries (5 tries within 0.4 s) outlast
no health check, and `cache_aware` may pick the stopping worker again on each of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from srt.testing.server_process import LocalProcess, free_port

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")
VOCAB = "o200k_base.tiktoken"
VOCAB_CRATE = "tiktoken-rs-0.7.0"
FETCH_VOCAB = "cargo fetch --locked --manifest-path scripts/router-vocab/Cargo.toml"
FAILOVER_FLAGS = (
    *("--health-check-interval-secs", "1", "--health-failure-threshold", "1"),
    *("--retry-max-retries", "6", "--retry-initial-backoff-ms", "100"),
    *("--retry-backoff-multiplier", "2", "--retry-jitter-factor", "0"),
)


@dataclass
class RouterProcess(LocalProcess):
    def healthy_workers(self) -> int | None:
        """How many workers `/readiness` counts healthy, or None when nothing answers."""
        try:
            with urllib.request.urlopen(f"{self.url}/readiness", timeout=5) as response:
                body = json.load(response)
        except urllib.error.HTTPError as e:  # 503 while no worker is healthy
            body = json.loads(e.read() or b"{}")
        except OSError:
            return None
        count = body.get("healthy_workers", 0)
        return int(count) if isinstance(count, int) else 0

    def wait_healthy_workers(self, count: int, timeout: float = START_TIMEOUT_S) -> None:
        """Returns once exactly `count` workers are healthy; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the router exited with {self.process.returncode}")
            if self.healthy_workers() == count:
                return
            time.sleep(0.2)
        raise TimeoutError(f"the router did not count {count} healthy workers in {timeout:g} s")

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def harmony_vocab_dir() -> Path | None:
    """The folder of the tiktoken-rs crate's sources that holds `VOCAB`, once cargo has fetched
    it (`FETCH_VOCAB`); None before."""
    cargo_home = Path(os.environ.get("CARGO_HOME") or Path.home() / ".cargo")
    for assets in sorted((cargo_home / "registry" / "src").glob(f"*/{VOCAB_CRATE}/assets")):
        if (assets / VOCAB).is_file():
            return assets
    return None


def router_env(worker_urls: Sequence[str]) -> dict[str, str]:
    """The router's environment: this process's, and for gRPC workers where `VOCAB` is."""
    env = dict(os.environ)
    if any(url.startswith("grpc://") for url in worker_urls):
        vocab = harmony_vocab_dir()
        if vocab is None:
            raise RuntimeError(f"sglang-router's gRPC mode needs {VOCAB}: run `{FETCH_VOCAB}`")
        env["TIKTOKEN_ENCODINGS_BASE"] = str(vocab)
    return env


def router_command(
    worker_urls: Sequence[str], policy: str, port: int, model_path: Path | str | None = None
) -> list[str]:
    """The command line of sglang-router on `port` in front of `worker_urls` (with the
    tokenizer of `model_path`, when given)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    return [
        *(sys.executable, "-m", "sglang_router.launch_router"),
        *("--worker-urls", *worker_urls),
        *("--policy", policy),
        *("--host", "127.0.0.1", "--port", str(port)),
        # Its exporter's default port (29000) would collide between two routers.
        *("--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())),
        *FAILOVER_FLAGS,
        *(("--model-path", str(model_path)) if model_path is not None else ()),
        *("--log-level", "warn"),
    ]


@contextlib.contextmanager
def running_router(
    worker_urls: Sequence[str], policy: str, model_path: Path | str | None = None
) -> Iterator[RouterProcess]:
    """A router whose workers are all healthy for the duration of the block."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="sglang-router-") as log_dir:
        log_path = Path(log_dir) / f"router-{port}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                router_command(worker_urls, policy, port, model_path),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=router_env(worker_urls),
            )
        router = RouterProcess(process, port, log_path)
        try:
            try:
                router.wait_healthy_workers(len(worker_urls))
            except (RuntimeError, TimeoutError) as e:
                raise RuntimeError(f"{e}:\n{router.output()}") from e
            yield router
        finally:
            router.stop()
