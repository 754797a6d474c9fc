"""A real `srt-serve` in a subprocess, for the tests and benches that talk HTTP to one.

    with running_server(model_dir, "--api-key", "k") as server:
        requests go to server.url

The server listens on 127.0.0.1, on a free port; `running_server` returns once `/health` answers
200 and, on exit, sends SIGTERM and waits for the process (killing it if it hangs). A server
spawned with `--grpc-mode` is a `GrpcServerProcess`: its `url` is `grpc://...`, and it is healthy
when its scheduler service's HealthCheck says so. Its combined
output is kept in a file (`server.output()`), shown when it fails to start. With no model,
srt-serve serves its default (SmolLM2).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class LocalProcess:
    """A process serving HTTP on a port of 127.0.0.1, its output written to `log_path`."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


@dataclass
class ServerProcess(LocalProcess):
    def output_tail(self, lines: int = 30) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def health_status(self) -> int | None:
        """The status of `/health`, or None when nothing answers."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                status: int = response.status
                return status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return None

    def healthy(self) -> bool:
        return self.health_status() == 200

    def wait_healthy(self, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"srt-serve exited with {self.process.returncode}:\n{self.output()}"
                )
            if self.healthy():
                return
            time.sleep(0.2)
        raise TimeoutError(f"srt-serve was not healthy in {timeout:g} s:\n{self.output()}")

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, then the exit status (the process is killed if it outlives `timeout`)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


@dataclass
class GrpcServerProcess(ServerProcess):
    """`srt-serve --grpc-mode`: SGLang's scheduler service, no HTTP."""

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def healthy(self) -> bool:
        from srt.testing.grpc_client import SchedulerClient  # grpcio: only for gRPC servers

        with SchedulerClient(self.address) as client:
            return client.healthy()


def spawn_server(model: Path | str | None, *flags: str, log_dir: Path) -> ServerProcess:
    """Starts `srt-serve --model MODEL FLAGS` on a free port of 127.0.0.1, without waiting for
    it; its output goes to a file in `log_dir`. With `--grpc-mode` among `flags`, a
    `GrpcServerProcess`."""
    port = free_port()
    log_path = log_dir / f"srt-serve-{port}.log"
    command = [sys.executable, "-m", "srt.entrypoints.cli", "--host", "127.0.0.1"]
    command += [*(["--model", str(model)] if model is not None else []), "--port", str(port)]
    command += flags
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ)
        )
    kind = GrpcServerProcess if "--grpc-mode" in flags else ServerProcess
    return kind(process, port, log_path)


@contextlib.contextmanager
def running_server(model: Path | str | None, *flags: str) -> Iterator[ServerProcess]:
    """A healthy server for the duration of the block (on srt-serve's default model when
    `model` is None); stopped (SIGTERM) after it."""
    with (
        tempfile.TemporaryDirectory(prefix="srt-serve-") as log_dir,
        all_healthy([spawn_server(model, *flags, log_dir=Path(log_dir))]) as (server,),
    ):
        yield server


@contextlib.contextmanager
def all_healthy(servers: list[ServerProcess]) -> Iterator[list[ServerProcess]]:
    """`servers` (spawned side by side) once each answers `/health`; every one stopped after
    the block, or as soon as one fails to start."""
    try:
        for server in servers:
            server.wait_healthy()
        yield servers
    finally:
        for server in servers:
            server.stop()
