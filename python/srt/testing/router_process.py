"""sglang-router in front of `srt-serve` replicas, for the tests and benches of data parallelism.

    with running_router([a.url, b.url], "cache_aware") as router:
        requests go to router.url

The router listens on 127.0.0.1, on a free port (its Prometheus exporter on another); it
returns once `/readiness` counts every worker healthy and, on exit, is stopped (SIGTERM, then
killed if it hangs). Its worker health check runs every second and takes one failure to mark a
worker down, so a test sees a stopped replica leave quickly. Needs `pip install sglang-router`.
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


def router_command(worker_urls: Sequence[str], policy: str, port: int) -> list[str]:
    """The command line of sglang-router on `port` in front of `worker_urls`."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    return [
        *(sys.executable, "-m", "sglang_router.launch_router"),
        *("--worker-urls", *worker_urls),
        *("--policy", policy),
        *("--host", "127.0.0.1", "--port", str(port)),
        # Its exporter's default port (29000) would collide between two routers.
        *("--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())),
        *("--health-check-interval-secs", "1", "--health-failure-threshold", "1"),
        *("--log-level", "warn"),
    ]


@contextlib.contextmanager
def running_router(worker_urls: Sequence[str], policy: str) -> Iterator[RouterProcess]:
    """A router whose workers are all healthy for the duration of the block."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="sglang-router-") as log_dir:
        log_path = Path(log_dir) / f"router-{port}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                router_command(worker_urls, policy, port),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(os.environ),
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
