"""The hand-written stub `python/srt/_rust.pyi` against the compiled module `srt._rust`.

Every public class, function and method the stub declares must exist in the module, and every
public one the module has must be in the stub, so the stub cannot drift from the bindings.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from srt import _rust

STUB = Path(__file__).resolve().parents[1] / "python" / "srt" / "_rust.pyi"


def _public(names: set[str]) -> set[str]:
    return {n for n in names if not n.startswith("_") or n == "__version__"}


def _stub_tree() -> dict[str, set[str] | None]:
    """Top-level names of the stub → the public members of each class (None for the rest)."""
    tree: dict[str, set[str] | None] = {}
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.ClassDef):
            members = set()
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    members.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
            tree[node.name] = _public(members)
        elif isinstance(node, ast.FunctionDef):
            tree[node.name] = None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            tree[node.target.id] = None
    return {k: v for k, v in tree.items() if k in _public({k})}


def _own_members(cls: type) -> set[str]:
    """Public members a class defines itself (methods and properties, not inherited ones)."""
    return {n for n in vars(cls) if not n.startswith("_")}


def test_stub_declares_exactly_the_module_names() -> None:
    stub = _stub_tree()
    modules = {n for n in dir(_rust) if inspect.ismodule(getattr(_rust, n))}
    module = _public(set(dir(_rust))) - modules
    assert set(stub) == module


def test_stub_classes_declare_exactly_their_members() -> None:
    for name, members in _stub_tree().items():
        obj = getattr(_rust, name)
        if members is None:
            assert not inspect.isclass(obj), f"{name} is a class in the module but not in the stub"
            continue
        assert inspect.isclass(obj), f"{name} is a class in the stub but not in the module"
        if issubclass(obj, BaseException):
            continue
        declared = {m for m in members if not m.startswith("__")}
        assert declared == _own_members(obj), f"members of {name} differ"
