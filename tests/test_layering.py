"""Which way imports run (docs/design.md §7): from the top floor down, never back up.

    entrypoints → managers → model_executor → models → layers → kernels

`mem_cache` and `ipc` sit under every floor that uses them and import only the ground floor
(`io_struct`, `server_args`, `sampling_params`, `envs`, ...), which anyone may import. Imports
under `if TYPE_CHECKING:` do not run and do not count; imports inside functions do.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import srt

PACKAGE = Path(srt.__file__).parent

# Floors, top (0) to bottom: a module may import its own floor and the floors below it.
FLOORS = {
    "entrypoints": 0,
    "testing": 0,  # fixtures' helpers: may use anything, used by nothing in the package
    "managers": 1,
    "model_executor": 2,
    "models": 3,
    "layers": 4,
    "kernels": 5,
    "mem_cache": 6,
    "ipc": 6,
    "distributed": 6,  # tensor-parallel groups and collectives (torch.distributed)
    "constrained": 2,  # grammars for the model runner (xgrammar, torch)
    "function_call": 1,  # tool calls read from output text, for the OpenAI API (no torch)
}
GROUND = 7
TOP_MODULES = {"srt", "srt.__main__"}  # `import srt` lazily offers the Engine

# Upward runtime imports still to be removed, each (importer, imported) with the issue part that
# removes it. None are left: the scheduler's torch imports (issue 14 part 1) went with this test,
# and the main process's torch imports (part 5) are downward ones, checked by that part's test.
KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()

# The scheduler's modules handle ints: none imports torch or the layers directly.
SCHEDULER_MODULES = [
    "srt.managers.scheduler",
    "srt.managers.schedule_batch",
    "srt.managers.cache_manager",
    "srt.managers.scheduler_stage",
    "srt.managers.schedule_policy",
    "srt.managers.stop_strings",
    "srt.managers.req_queue",
    "srt.managers.batch_log",
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def floor(module: str) -> int:
    if module in TOP_MODULES:
        return 0
    parts = module.split(".")
    return FLOORS.get(parts[1], GROUND) if len(parts) > 1 else GROUND


def is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    # `.pyi`: the Rust extension `srt._rust`, a ground-floor module like any other.
    return (
        any(path.with_suffix(s).exists() for s in (".py", ".pyi"))
        or (path / "__init__.py").exists()
    )


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, imported module) of every import that runs: all but those under TYPE_CHECKING."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from runtime_imports(ast.Module(body=[child], type_ignores=[]))
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                yield node.lineno, full if is_module(full) else node.module
        else:
            yield from runtime_imports(node)


def srt_modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield module_name(path), path


def test_the_floors_are_known() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(FLOORS)


def upward_imports() -> list[tuple[str, str, int]]:
    found = []
    for importer, path in srt_modules():
        for line, imported in runtime_imports(ast.parse(path.read_text(), str(path))):
            if imported.split(".")[0] != "srt":
                continue
            if floor(imported) < floor(importer):
                found.append((importer, imported, line))
    return found


def test_no_runtime_import_climbs_a_floor() -> None:
    found = upward_imports()
    unexpected = [
        f"{a} imports {b} (line {n})" for a, b, n in found if (a, b) not in KNOWN_EXCEPTIONS
    ]
    assert unexpected == []
    stale = KNOWN_EXCEPTIONS - {(a, b) for a, b, _ in found}
    assert stale == set(), "known exceptions that are gone: remove them from the list"


def test_the_checker_sees_upward_and_hidden_imports() -> None:
    source = textwrap.dedent(
        """
        from typing import TYPE_CHECKING
        import srt.layers.sampler
        from srt.managers import scheduler
        if TYPE_CHECKING:
            from srt.entrypoints.engine import Engine
        def late():
            from srt.entrypoints import engine
        """
    )
    imported = [name for _, name in runtime_imports(ast.parse(source))]
    assert imported == [
        "typing",
        "srt.layers.sampler",
        "srt.managers.scheduler",
        "srt.entrypoints.engine",
    ]
    assert (
        floor("srt.layers.sampler")
        > floor("srt.model_executor.model_runner")
        > floor("srt.managers.scheduler")
    )
    assert floor("srt.io_struct") == GROUND


@pytest.mark.parametrize("module", SCHEDULER_MODULES)
def test_scheduler_modules_import_neither_torch_nor_layers(module: str) -> None:
    path = PACKAGE.parent.joinpath(*module.split(".")).with_suffix(".py")
    imported = {name for _, name in runtime_imports(ast.parse(path.read_text()))}
    assert not {name for name in imported if name.split(".")[0] == "torch"}
    assert not {name for name in imported if name.startswith("srt.layers")}


def test_the_scheduler_imports_without_torch() -> None:
    """In a fresh interpreter where torch cannot be imported at all, the scheduler module
    imports, and pulls in neither the layers nor the models."""
    script = textwrap.dedent(
        """
        import sys
        from importlib.abc import MetaPathFinder

        class NoTorch(MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError(f"the scheduler imported {name}")
                return None

        sys.meta_path.insert(0, NoTorch())
        import srt.managers.scheduler
        loaded = sorted(m for m in sys.modules if m.startswith(("srt.layers", "srt.models")))
        assert not loaded, loaded
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
