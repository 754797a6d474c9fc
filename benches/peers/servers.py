"""One engine's server as a child process of the benchmark: started in a process group of its
own, waited for, checked idle, and always stopped with every process it started."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import psutil
from serving_client import ProcessTreeCpu

HOST = "127.0.0.1"
"""Every server listens here and the benchmark talks to nothing else."""

# urllib would send requests through a proxy named in the environment; these go to the loopback
# address only.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def port_in_use(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=1):
        return True
    return False


class ServerError(RuntimeError):
    pass


class Server:
    """`with Server(...) as server:` starts the command and waits until `/v1/models` answers;
    leaving the block, by any way, stops the server's process group and any descendant that
    left it."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        port: int,
        log_path: Path,
        startup_timeout_s: float,
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.port = port
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise ServerError("the server is not running")
        return self.process.pid

    def __enter__(self) -> Server:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        if port_in_use(self.port):
            raise ServerError(
                f"something already listens on {HOST}:{self.port}; pick another --port-base"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                env={**os.environ, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # A group of its own: stopping it reaches every process the server forked, and
                # the terminal's Ctrl-C reaches the benchmark, whose `finally` stops it.
                start_new_session=True,
            )
        deadline = started + self.startup_timeout_s
        while time.monotonic() < deadline:
            status = self.process.poll()
            if status is not None:
                raise ServerError(
                    f"the server exited with status {status} while starting:\n{self.log_tail()}"
                )
            if self._answers():
                self.startup_s = time.monotonic() - started
                return
            time.sleep(1.0)
        raise ServerError(
            f"the server did not answer within {self.startup_timeout_s:.0f} s:\n{self.log_tail()}"
        )

    def _answers(self) -> bool:
        try:
            with _OPENER.open(f"{self.base_url}/v1/models", timeout=5) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_idle(
        self, timeout_s: float, window_s: float = 1.0, busy_cores: float = 0.1
    ) -> tuple[bool, float]:
        """Waits until the server's process tree uses under `busy_cores` of CPU over a window,
        so no earlier work (an abandoned request, a warm-up) runs into the next measurement.
        Returns whether it got idle and the seconds waited."""
        cpu = ProcessTreeCpu(self.pid)
        started = time.monotonic()
        while True:
            cpu.start()
            time.sleep(window_s)
            if cpu.seconds() < busy_cores * window_s:
                return True, time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                return False, time.monotonic() - started

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to the group, then SIGKILL to whatever is left of it and of the descendants
        seen before, after `grace_s`."""
        process = self.process
        if process is None:
            return
        self.process = None
        try:
            descendants = psutil.Process(process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            descendants = []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
        psutil.wait_procs(descendants, timeout=max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        for child in descendants:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        process.wait()
