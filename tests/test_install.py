"""srt is used from the installed wheel, not from the source tree."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import files, packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_PACKAGE = ROOT / "python" / "srt"
"""The package's source (maturin's `python-source`). Not the repository root: a virtual
environment made inside the clone (`python -m venv .venv`) installs the wheel under it."""

PROBE = """
import importlib.metadata, json, srt, srt._rust, srt.kernels.triton.store_kv_cache as kernel
installed = importlib.metadata.distribution("srt")
print(json.dumps({
    "srt": srt.__file__,
    "rust": srt._rust.__file__,
    "kernel": kernel.__file__,
    "installed_files": [str(installed.locate_file(f)) for f in installed.files or []],
    "version": srt.__version__,
    "rust_version": srt._rust.__version__,
}))
"""


def test_imports_from_the_installed_wheel(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    installed = {Path(f).resolve() for f in found["installed_files"]}
    for key in ("srt", "rust", "kernel"):
        path = Path(found[key]).resolve()
        assert not path.is_relative_to(SOURCE_PACKAGE), f"{key} imported from the source: {path}"
        assert path in installed, f"{key} is not a file of the installed srt: {path}"
    assert found["version"] == found["rust_version"]


def test_kernels_ship_inside_srt_only() -> None:
    shipped = [str(f) for f in files("srt") or []]
    assert any(f.startswith("srt/kernels/") and f.endswith(".py") for f in shipped), shipped
    assert not [f for f in shipped if f.startswith("kernels/")]
    assert any(f.startswith("srt/_rust") for f in shipped)


def test_the_repository_root_shadows_no_installed_module() -> None:
    """`python -m pytest` puts the root first on `sys.path`: a package or module there named
    like an installed distribution's (a top-level `kernels/`, say, which transformers imports
    from the `kernels` distribution) would be imported in its place."""
    importable = {
        entry.stem if entry.suffix == ".py" else entry.name
        for entry in ROOT.iterdir()
        if entry.suffix == ".py" or (entry / "__init__.py").is_file()
    }
    installed = packages_distributions()
    assert not {name: installed[name] for name in importable if name in installed}


def test_the_playground_page_ships_inside_srt() -> None:
    shipped = [str(f) for f in files("srt") or []]
    assert "srt/entrypoints/http/static/playground.html" in shipped, shipped


def test_the_grpc_service_definition_ships_inside_srt() -> None:
    """`--grpc-mode` generates its messages from the .proto at first use."""
    shipped = [str(f) for f in files("srt") or []]
    assert "srt/entrypoints/grpc/sglang_scheduler.proto" in shipped, shipped
