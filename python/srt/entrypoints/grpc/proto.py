"""The Python messages of `sglang_scheduler.proto`, generated from it at first use.

Nothing generated is kept in the repository: the first `load()` on a machine runs `protoc`
(grpcio-tools' bundled compiler) over the .proto that ships beside this module, into srt's cache
directory under a name keyed by the file's hash, and later loads import that module. A changed
.proto gets a fresh module; two servers starting at once each write their own copy and one
rename wins (the copies are identical). Only the messages are generated: the service is
registered by hand (`service.py`), so no generated gRPC stub is needed.

The generated module is imported under its own name (`sglang_scheduler_pb2`), once per process.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from srt import envs

PROTO = Path(__file__).with_name("sglang_scheduler.proto")
MODULE = "sglang_scheduler_pb2"
INSTALL_HINT = "pip install 'srt[grpc]'"


class GrpcUnavailable(RuntimeError):
    """grpcio or grpcio-tools is not installed."""


@functools.cache
def load() -> ModuleType:
    """The generated message module (generated first if this machine has none for this .proto).
    Raises `GrpcUnavailable` without grpcio-tools."""
    directory = _generated_dir()
    if not (directory / f"{MODULE}.py").exists():
        _generate(directory)
    spec = importlib.util.spec_from_file_location(MODULE, directory / f"{MODULE}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module
    spec.loader.exec_module(module)
    return module


def _generated_dir() -> Path:
    digest = hashlib.sha256(PROTO.read_bytes()).hexdigest()[:16]
    return envs.cache_dir() / "grpc" / digest


def _generate(directory: Path) -> None:
    try:
        from grpc_tools import protoc
    except ImportError as e:
        raise GrpcUnavailable(f"--grpc-mode needs grpcio-tools: {INSTALL_HINT}") from e
    # The well-known types (struct.proto, timestamp.proto) ship inside grpcio-tools.
    well_known = Path(protoc.__file__).parent / "_proto"
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=directory.parent))
    try:
        status = protoc.main(
            [
                "protoc",
                f"-I{PROTO.parent}",
                f"-I{well_known}",
                f"--python_out={staging}",
                str(PROTO),
            ]
        )
        if status != 0:
            raise RuntimeError(f"protoc failed on {PROTO} (exit status {status})")
        try:
            os.rename(staging, directory)
        except OSError:  # another process renamed its identical copy first
            if not (directory / f"{MODULE}.py").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
