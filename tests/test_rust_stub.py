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


def _stub_parameters(function: ast.FunctionDef) -> list[str]:
    """A stub function's parameter names without `self`: `*name` for a variadic one, `name=`
    for a keyword-only one."""
    arguments = function.args
    names = [a.arg for a in arguments.posonlyargs + arguments.args if a.arg != "self"]
    if arguments.vararg is not None:
        names.append(f"*{arguments.vararg.arg}")
    return names + [f"{a.arg}=" for a in arguments.kwonlyargs]


def _stub_functions() -> dict[str, ast.FunctionDef]:
    """Every function of the stub by its dotted name (`Class.method` for methods)."""
    functions: dict[str, ast.FunctionDef] = {}
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    functions[f"{node.name}.{item.name}"] = item
    return functions


def _bound_parameters(name: str) -> list[str] | None:
    """The binding's parameter names of `name` (as `_stub_functions` names it, marked as
    `_stub_parameters` marks them), from the text signature PyO3 gives it; None for a
    property, whose getter has none."""
    owner, _, member = name.rpartition(".")
    if owner:
        cls = getattr(_rust, owner)
        if inspect.isdatadescriptor(inspect.getattr_static(cls, member)):
            return None
        target = cls if member == "__init__" else getattr(cls, member)
    else:
        target = getattr(_rust, name)
    marked: dict[inspect._ParameterKind, str] = {
        inspect.Parameter.VAR_POSITIONAL: "*{}",
        inspect.Parameter.KEYWORD_ONLY: "{}=",
    }
    return [
        marked.get(p.kind, "{}").format(p.name)
        for p in inspect.signature(target).parameters.values()
        if p.name not in ("self", "$self")
    ]


def test_stub_parameters_are_the_bindings() -> None:
    """Each function's, method's and constructor's parameters are named, and keyword-only or
    not, as the binding takes them: a spec's fields or a call's arguments cannot drift."""
    wrong = []
    for name, function in _stub_functions().items():
        bound = _bound_parameters(name)
        if bound is not None and bound != _stub_parameters(function):
            wrong.append(f"{name}: stub {_stub_parameters(function)}, binding {bound}")
    assert not wrong, "\n".join(wrong)
