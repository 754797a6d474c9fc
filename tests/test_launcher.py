"""The launcher: the real three-process wiring, and cleanup in every way a server can end.

Each exit case lists /dev/shm and the launcher's child pids before and after: afterwards no
child may be alive and no ring of that launcher may be left.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import psutil
import pytest
from tokenizers import Tokenizer

from srt.entrypoints.launcher import Child, ChildDied, Launcher
from srt.io_struct import (
    BatchStrOut,
    FinishReason,
    FlushCacheOut,
    FlushCacheReq,
    GetLoadOut,
    GetLoadReq,
    HealthCheckOut,
    HealthCheckReq,
    Message,
    TokenizedGenerateReq,
)
from srt.ipc.channel import Receiver, Sender
from srt.sampling_params import SamplingParams
from srt.server_args import ServerArgs
from srt.server_cli import parse_args


@pytest.fixture(scope="module")
def model_dir(tiny_model_factory: Callable[[str], Path]) -> Path:
    return tiny_model_factory("llama")


def stage_flags(model: Path) -> list[str]:
    return ["--model-path", str(model), "--max-total-tokens", "512", "--max-running-requests", "4"]


def rings_of(pid: int) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"srt-{pid}-"))


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: list[int], timeout: float = 15) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


class Server:
    """`launcher_process.py` (the stages without the HTTP server) in a subprocess."""

    def __init__(self, model: Path, wait_ready: bool = True) -> None:
        self.shm_before = set(os.listdir("/dev/shm"))
        script = Path(__file__).with_name("launcher_process.py")
        cmd = [sys.executable, str(script), *stage_flags(model)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.children: list[int] = []
        if wait_ready:
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline()
            assert line.startswith("srt: ready"), line + self.stderr()
            self.children = [c.pid for c in psutil.Process(self.proc.pid).children()]
            pids = line.split("(")[1].rstrip(")\n").split(", ")  # "scheduler pid N, ..."
            self.stage_pids = {p.split()[0]: int(p.split()[-1]) for p in pids}

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return ""
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def finish(self, timeout: float = 30) -> tuple[int, str]:
        rc = self.proc.wait(timeout)
        return rc, self.stderr()

    def assert_clean(self) -> None:
        assert wait_gone(self.children) == [], "a stage process outlived the launcher"
        assert rings_of(self.proc.pid) == []
        assert set(os.listdir("/dev/shm")) - self.shm_before <= {
            n for n in os.listdir("/dev/shm") if not n.startswith(f"srt-{self.proc.pid}-")
        }


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_everything_and_exits_zero(model_dir: Path, sig: signal.Signals) -> None:
    server = Server(model_dir)
    assert set(server.stage_pids.values()) <= set(server.children)
    assert rings_of(server.proc.pid) == []  # unlinked as soon as every end attached
    server.proc.send_signal(sig)
    rc, err = server.finish()
    assert rc == 0, err
    assert "process" not in err, err  # every stage exited 0
    server.assert_clean()


@pytest.mark.slow
def test_a_crashed_child_is_named_and_the_launcher_exits_nonzero(model_dir: Path) -> None:
    server = Server(model_dir)
    os.kill(server.stage_pids["scheduler"], signal.SIGKILL)
    rc, err = server.finish()
    assert rc == 1
    assert "scheduler process" in err, err
    assert "SIGKILL" in err, err
    server.assert_clean()


@pytest.mark.slow
def test_a_child_failing_at_startup_is_reported_with_its_error(tmp_path: Path) -> None:
    server = Server(tmp_path / "missing", wait_ready=False)
    rc, err = server.finish()
    assert rc == 1
    # Both stages fail; the launcher names the first it hears of, with its error.
    assert ("detokenizer process" in err and "ValueError: no tokenizer at" in err) or (
        "scheduler process" in err and "ValueError: no model at" in err
    ), err
    assert "cannot start" in err, err
    server.children = []
    server.assert_clean()


@pytest.mark.slow
def test_kill_9_of_the_launcher_takes_the_children_with_it(model_dir: Path) -> None:
    server = Server(model_dir)
    server.proc.kill()
    server.proc.wait()
    server.assert_clean()


@pytest.fixture(scope="module")
def launched(model_dir: Path) -> Iterator[tuple[Launcher, Sender, Receiver]]:
    launcher = Launcher(parse_args(stage_flags(model_dir)))
    sender, receiver = launcher.start()
    yield launcher, sender, receiver
    launcher.stop(sender)


@pytest.mark.slow
def test_the_pipeline_carries_requests_and_replies(
    launched: tuple[Launcher, Sender, Receiver], model_dir: Path
) -> None:
    launcher, sender, receiver = launched
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = tuple(tokenizer.encode("def main(): return 42").ids)

    async def scenario() -> tuple[list[BatchStrOut], list[Message]]:
        params = SamplingParams(max_new_tokens=6, temperature=0, ignore_eos=True)
        await sender.send(TokenizedGenerateReq("r1", ids, params))
        outs = [await receiver.recv()]
        for msg in (FlushCacheReq("f"), GetLoadReq("l"), HealthCheckReq("h")):
            await sender.send(msg)
        return outs, [await receiver.recv() for _ in range(3)]  # type: ignore[return-value]

    (out,), (flushed, load, health) = asyncio.run(scenario())
    assert isinstance(out, BatchStrOut)
    assert out.rids == ("r1",)
    assert len(out.output_ids[0]) == 6
    assert out.output_strs == (tokenizer.decode(list(out.output_ids[0])),)
    assert out.finished_reasons == (FinishReason("length", length=6),)
    assert flushed == FlushCacheOut("f", True)
    assert isinstance(load, GetLoadOut)
    assert (load.rid, load.num_used_tokens, load.invariant_violations) == ("l", 0, 0)
    assert health == HealthCheckOut("h", True)
    assert launcher.dead_child() is None


@pytest.mark.slow
def test_idle_stages_use_no_cpu(launched: tuple[Launcher, Sender, Receiver]) -> None:
    launcher = launched[0]
    procs = [psutil.Process(c.process.pid) for c in launcher.children]
    time.sleep(0.5)
    before = [sum(p.cpu_times()[:2]) for p in procs]
    time.sleep(2)
    used = [sum(p.cpu_times()[:2]) - b for p, b in zip(procs, before, strict=True)]
    assert max(used) < 0.02 * 2, f"idle stages used {used} s of CPU in 2 s"


def test_start_failure_raises_child_died_and_cleans_up(tmp_path: Path) -> None:
    launcher = Launcher(ServerArgs(model_path=str(tmp_path)))
    with pytest.raises(ChildDied, match=r"scheduler|detokenizer"):
        launcher.start()
    assert all(c.process.exitcode is not None for c in launcher.children)
    assert rings_of(os.getpid()) == []


def exit_after(conn: Connection, delay_s: float, report: str, code: int) -> None:
    """A stand-in stage: reports `report` (if any) on its pipe after `delay_s`, then exits."""
    time.sleep(delay_s)
    if report:
        conn.send_bytes(report.encode())
    os._exit(code)


def test_a_stage_that_lost_its_peer_is_not_blamed_for_the_peers_death() -> None:
    # The detokenizer notices the scheduler's rings close and exits at once; the killed
    # scheduler (a large address space) finishes exiting later. The scheduler is to blame.
    fork = multiprocessing.get_context("fork")
    launcher = Launcher(ServerArgs())
    plans = {
        "scheduler": (0.5, "", 9),
        "detokenizer": (0.0, "BrokenPipeError: ring 'x': its producer (pid 1) is gone", 1),
    }
    for name, plan in plans.items():
        ours, theirs = fork.Pipe(duplex=False)
        process = fork.Process(target=exit_after, args=(theirs, *plan))
        process.start()
        launcher.children.append(Child(name, process, ours))
    try:
        blamed = asyncio.run(launcher.watch())
    finally:
        for child in launcher.children:
            child.process.join()
    assert blamed.name == "scheduler"
    assert blamed.why().endswith("exited with code 9")
