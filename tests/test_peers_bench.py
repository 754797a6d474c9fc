"""benches/peers: the pure parts of the side-by-side benchmark (run order, server commands and
engine flags, vLLM's dtype, the table of medians, vLLM's requirements, the converter's venv);
no server starts here and nothing is downloaded."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import peers.install
import pytest
from peers.bench import WORKLOADS, Paths, schedule, server_command
from peers.cpu import llama_cpu_options
from peers.engines import all_engines, replace_options, select_engines, vllm_default_dtype
from peers.install import (
    CONVERTER_MODULES,
    TOOLS_PACKAGES,
    Installer,
    Models,
    converter_requirements,
    environment_site_dirs,
    link_site_dirs,
    missing_modules,
    venv_site_packages,
    vllm_requirements,
)
from peers.report import ROWS, markdown_table, medians

from srt.kernels.cpu import cpu_kernels
from srt.testing import smollm2

ENGINE_CONFIGS = [
    "vllm-all-cores:bf16=--dtype bfloat16 --max-model-len 2048",
    "llama-q4_1:t1=-t 1",
]


def engines_for(names: str, vllm_dtype: str = "float32") -> list[Any]:
    engines = all_engines([0, 1], vllm_dtype, ["bf16=--dtype bfloat16"], ENGINE_CONFIGS)
    return select_engines(engines, names)


def fake_paths(tmp_path: Path) -> Paths:
    models = Models(
        tmp_path / "hf", tmp_path / "q4_1.gguf", tmp_path / "f16.gguf", tmp_path / "q4_k_m.gguf"
    )
    return Paths(
        models, tmp_path / "srt-serve", tmp_path / "venv", tmp_path / "llama-server", tmp_path
    )


def test_rounds_interleave_engines_and_alternate_their_order() -> None:
    engines = engines_for("srt,vllm,llama-q4_1")
    order = [(r, e.name) for r, e in schedule(engines, 3)]
    assert order == [
        (1, "srt"),
        (1, "vllm"),
        (1, "llama-q4_1"),
        (2, "llama-q4_1"),
        (2, "vllm"),
        (2, "srt"),
        (3, "srt"),
        (3, "vllm"),
        (3, "llama-q4_1"),
    ]
    with pytest.raises(ValueError, match="unknown engines"):
        engines_for("srt,sglang")


def test_server_commands_listen_on_loopback_with_each_engine_s_weights(tmp_path: Path) -> None:
    paths = fake_paths(tmp_path)
    models = paths.models
    commands = {
        e.name: server_command(e, 9000, paths, 2)
        for e in engines_for("srt-bf16,vllm-all-cores,llama-f16,llama-q4_1")
    }
    for argv, _ in commands.values():
        assert argv[argv.index("--host") + 1] == "127.0.0.1"
        assert argv[argv.index("--port") + 1] == "9000"
    srt_argv, _ = commands["srt-bf16"]
    assert srt_argv[-2:] == ["--dtype", "bfloat16"]
    # srt serves its own default model: the Q4_1 GGUF as the package ships it.
    assert "--model-path" not in srt_argv
    vllm_argv, vllm_env = commands["vllm-all-cores"]
    assert vllm_argv[:3] == [str(tmp_path / "venv" / "bin" / "vllm"), "serve", str(models.hf_dir)]
    assert vllm_argv[-4:] == ["--max-model-len", "4096", "--dtype", "float32"]
    assert vllm_env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert vllm_env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    for name, gguf in (("llama-f16", models.f16_gguf), ("llama-q4_1", models.q4_1_gguf)):
        argv, _ = commands[name]
        assert argv[argv.index("-m") + 1] == str(gguf)


def test_srt_and_llama_server_serve_the_same_q4_k_m_file(tmp_path: Path) -> None:
    paths = fake_paths(tmp_path)
    srt, llama = engines_for("srt-q4_k_m,llama-q4_k_m")
    assert (srt.label, llama.label) == ("srt Q4_K_M", "llama-server Q4_K_M")
    srt_argv, _ = server_command(srt, 9000, paths, 2)
    llama_argv, _ = server_command(llama, 9001, paths, 2)
    assert srt_argv[0] == str(paths.srt_serve)
    assert srt_argv[srt_argv.index("--model-path") + 1] == str(tmp_path / "q4_k_m.gguf")
    assert llama_argv[llama_argv.index("-m") + 1] == str(tmp_path / "q4_k_m.gguf")
    # An engine derived from srt-q4_k_m serves the same file with its flags.
    (derived,) = select_engines(
        all_engines([0, 1], "float32", [], ["srt-q4_k_m:bf16=--dtype bfloat16"]),
        "srt-q4_k_m-bf16",
    )
    argv, _ = server_command(derived, 9000, paths, 2)
    assert argv[argv.index("--model-path") + 1] == str(tmp_path / "q4_k_m.gguf")
    assert argv[-2:] == ["--dtype", "bfloat16"]
    unprepared = dataclasses.replace(
        paths, models=dataclasses.replace(paths.models, q4_k_m_gguf=None)
    )
    with pytest.raises(ValueError, match="no q4_k_m GGUF"):
        server_command(llama, 9001, unprepared, 2)


def test_the_q4_k_m_file_is_quantized_once_from_the_converted_f16_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`Installer.models` with its tools replaced: the f16 GGUF converted from the Hugging Face
    directory, then `llama-quantize` of the same llama.cpp build run on it, each once."""
    commands: list[list[str]] = []

    def fake_run(argv: Sequence[str | Path], **kwargs: Any) -> None:
        command = [str(a) for a in argv]
        commands.append(command)
        out = command[command.index("--outfile") + 1] if "--outfile" in command else command[2]
        Path(out).write_bytes(b"GGUF")

    monkeypatch.setattr(peers.install, "run", fake_run)
    monkeypatch.setattr(peers.install.Installer, "llama_source", lambda self: tmp_path / "src")
    monkeypatch.setattr(peers.install.Installer, "tools", lambda self: tmp_path / "bin")
    monkeypatch.setattr(
        peers.install.Installer, "llama_quantize", lambda self: tmp_path / "llama-quantize"
    )
    monkeypatch.setattr(smollm2, "smollm2_path", lambda: tmp_path / "hf")
    monkeypatch.setattr(smollm2, "smollm2_gguf", lambda: tmp_path / "q4_1.gguf")
    installer = Installer(tmp_path / "cache", jobs=3)
    models = installer.models(need_f16=False, need_q4_k_m=True)
    f16 = tmp_path / "cache" / "models" / "SmolLM2-135M-Instruct.f16.gguf"
    q4_k_m = tmp_path / "cache" / "models" / "SmolLM2-135M-Instruct.Q4_K_M.gguf"
    assert (models.f16_gguf, models.q4_k_m_gguf) == (f16, q4_k_m)
    assert [c[1] for c in commands] == [str(tmp_path / "src" / "convert_hf_to_gguf.py"), str(f16)]
    assert commands[1] == [
        str(tmp_path / "llama-quantize"),
        str(f16),
        str(q4_k_m.with_suffix(".partial")),
        "Q4_K_M",
        "3",
    ]
    assert installer.models(need_f16=True, need_q4_k_m=True) == models
    assert len(commands) == 2


def run(engine: str, workload: str, round_: int, value: float | None, ok: bool = True) -> Any:
    result = {"is_result": ok, **{row.key: value for row in ROWS if row.workload == workload}}
    return {"round": round_, "engine": engine, "workload": workload, "result": result}


def test_table_takes_medians_of_successful_rounds_only() -> None:
    engines = engines_for("srt,llama-q4_1")
    runs = [
        run("srt", "random", 1, 30.0),
        run("srt", "random", 2, 40.0),
        run("srt", "random", 3, 50.0, ok=False),
        run("srt", "long", 1, 4000.0),
        run("srt", "long", 2, 6000.0),
        run("llama-q4_1", "random", 1, 10.0),
        run("llama-q4_1", "random", 2, 20.0, ok=False),
        # A server that never came up leaves a run without a result.
        {"round": 1, "engine": "llama-q4_1", "workload": None, "error": "did not serve"},
    ]
    table = medians(runs, engines)
    lines = markdown_table(table, engines, rounds=2).splitlines()
    assert lines[0] == "| workload | srt default | llama-server Q4_1 |"
    by_row = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in lines[2:]}
    assert len(by_row) == len(ROWS)
    assert by_row[ROWS[0].label] == ["35.0", "10.0 (1/2) |"]
    assert by_row[ROWS[2].label] == ["5.00", "n/a |"]
    assert table["srt"][ROWS[1].label] == {"median": None, "rounds": 0}
    assert {w.name for w in WORKLOADS} == {row.workload for row in ROWS}


@pytest.mark.parametrize(
    ("cap", "build", "wanted", "unwanted"),
    [
        (None, "native", "-DGGML_NATIVE=ON", None),
        ("avx512_bf16", "native", "-DGGML_NATIVE=ON", None),
        ("avx2", "avx2", "-DGGML_NATIVE=OFF", "-DGGML_AVX2=OFF"),
        ("avx2_vnni", "avx2_vnni", "-DGGML_AVX_VNNI=ON", "-DGGML_NATIVE=ON"),
        ("scalar", "scalar", "-DGGML_AVX2=OFF", "-DGGML_NATIVE=ON"),
    ],
)
def test_llama_server_is_built_for_the_cpu_srt_is_capped_at(
    cap: str | None, build: str, wanted: str, unwanted: str | None
) -> None:
    name, options = llama_cpu_options(cap)
    assert name == build
    assert wanted in options
    assert unwanted not in options
    assert not any("AVX512" in option or "AMX" in option for option in options)


def test_vllm_requirements_leave_out_extras_and_the_torch_family() -> None:
    metadata = "\n".join(
        [
            "Name: vllm-cpu",
            "Requires-Dist: regex",
            "Requires-Dist: transformers<5.20.0,>=5.16.1",
            'Requires-Dist: torch==2.13.0+cpu; platform_machine == "x86_64"',
            'Requires-Dist: torchaudio; platform_machine != "s390x"',
            "Requires-Dist: torchcodec>=0.14",
            'Requires-Dist: intel-openmp==2024.2.1; platform_machine == "x86_64"',
            'Requires-Dist: pandas; extra == "bench"',
        ]
    )
    assert vllm_requirements(metadata) == [
        "regex",
        "transformers<5.20.0,>=5.16.1",
        'intel-openmp==2024.2.1; platform_machine == "x86_64"',
    ]


def test_engine_configs_add_flags_that_replace_the_engine_s_own(tmp_path: Path) -> None:
    names = "srt-bf16,vllm-all-cores,vllm-all-cores-bf16,llama-q4_1,llama-q4_1-t1"
    engines = {e.name: e for e in engines_for(names)}
    assert engines["vllm-all-cores-bf16"].label == (
        "vllm-all-cores `--dtype bfloat16 --max-model-len 2048`"
    )
    assert engines["srt-bf16"].label == "srt `--dtype bfloat16`"
    commands = {
        name: server_command(e, 9000, fake_paths(tmp_path), 2) for name, e in engines.items()
    }
    argv, env = commands["vllm-all-cores-bf16"]
    # The engine's dtype and the benchmark's context length are replaced, not repeated.
    assert argv.count("--dtype") == argv.count("--max-model-len") == 1
    assert argv[-4:] == ["--dtype", "bfloat16", "--max-model-len", "2048"]
    assert env == commands["vllm-all-cores"][1]
    argv, _ = commands["llama-q4_1-t1"]
    assert argv[argv.index("-m") + 1] == str(tmp_path / "q4_1.gguf")
    assert argv[-7:] == ["-np", "16", "-c", "65536", "-kvu", "-t", "1"]
    assert argv.count("-t") == 1
    for bad, message in (
        ("vllm:fp32", "takes ENGINE:NAME"),
        ("vllm=--dtype float32", "takes ENGINE:NAME"),
        ("sglang:x=--tp 2", "no engine 'sglang'"),
        ("srt:bf16=--dtype bfloat16", "named twice"),
    ):
        with pytest.raises(ValueError, match=message):
            all_engines([0, 1], "float32", ["bf16=--dtype bfloat16"], [bad])


@pytest.mark.parametrize(
    ("flags", "given", "expected"),
    [
        (
            ["--dtype", "bfloat16", "--max-model-len", "4096"],
            ["--dtype=float32"],
            ["--max-model-len", "4096", "--dtype=float32"],
        ),
        (["-np", "16", "-kvu", "-t", "2"], ["-kvu"], ["-np", "16", "-t", "2", "-kvu"]),
        (
            ["-np", "16", "-kvu", "-t", "2"],
            ["-np", "4", "-t", "1"],
            ["-kvu", "-np", "4", "-t", "1"],
        ),
        (["--x=1", "--y", "-1"], ["--x", "2", "--y", "3"], ["--x", "2", "--y", "3"]),
        (["--a", "1"], [], ["--a", "1"]),
    ],
)
def test_a_given_option_replaces_the_default_with_its_value(
    flags: list[str], given: list[str], expected: list[str]
) -> None:
    assert replace_options(flags, given) == expected


@pytest.mark.parametrize(("native_bf16", "expected"), [(True, "bfloat16"), (False, "float32")])
def test_vllm_runs_in_the_dtype_srt_picks_for_this_cpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, native_bf16: bool, expected: str
) -> None:
    monkeypatch.setattr(cpu_kernels, "native_bf16_matmul", lambda: native_bf16)
    dtype, reason = vllm_default_dtype()
    assert dtype == expected
    assert ("natively" in reason) == native_bf16
    for name in ("vllm", "vllm-all-cores"):
        (engine,) = engines_for(name, vllm_dtype=dtype)
        argv, _ = server_command(engine, 9000, fake_paths(tmp_path), 2)
        assert argv[argv.index("--dtype") + 1] == expected
        assert {"bfloat16": "bf16"}.get(expected, expected) in engine.label


def make_venv(path: Path) -> Path:
    """A venv of this Python without pip (fast; nothing is downloaded), as `Installer.tools`
    makes one; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "bin" / "python"


def test_the_converter_s_venv_imports_this_environment_s_torch(tmp_path: Path) -> None:
    """The converter's imports come from this environment wherever it is, a venv made inside
    the clone included (a venv of this Python sees none of them by itself), all but what the
    tools venv installs itself."""
    python = make_venv(tmp_path / "tools")
    assert "torch" in missing_modules(python, list(CONVERTER_MODULES))
    link_site_dirs(tmp_path / "tools", environment_site_dirs())
    assert set(missing_modules(python, list(CONVERTER_MODULES))) <= set(TOOLS_PACKAGES)
    imported = subprocess.run(
        [str(python), "-c", "import numpy, torch, transformers; print(torch.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    torch_dir = Path(imported.stdout.strip()).parent.parent
    assert torch_dir in environment_site_dirs()


def test_tools_install_only_what_the_environment_lacks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`Installer.tools` with pip replaced: a fresh tools venv asks PyPI for CMake and
    sentencepiece, never for torch, numpy or transformers; a second call installs nothing."""
    pip_installs: list[list[str]] = []

    def fake_run(argv: Sequence[str | Path], **kwargs: Any) -> None:
        command = [str(a) for a in argv]
        if command[1:3] == ["-m", "venv"]:
            make_venv(Path(command[3]))
        elif command[1:4] == ["-m", "pip", "install"]:
            pip_installs.append(command[4:])
            site_packages = venv_site_packages(tmp_path / "tools-venv")
            for distribution in command[4:]:
                module = distribution.split("==")[0]
                (site_packages / module).mkdir(exist_ok=True)
                (site_packages / module / "__init__.py").write_text("")
        else:
            raise AssertionError(command)

    monkeypatch.setattr(peers.install, "run", fake_run)
    installer = Installer(tmp_path, jobs=1)
    bin_dir = installer.tools()
    assert pip_installs == [list(TOOLS_PACKAGES)]
    assert missing_modules(bin_dir / "python", list(CONVERTER_MODULES)) == []
    assert installer.tools() == bin_dir
    assert pip_installs == [list(TOOLS_PACKAGES)]


def test_what_the_converter_lacks_is_pinned_to_this_environment_s_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(CONVERTER_MODULES, "srt_no_such_module", "srt-no-such-distribution")
    assert converter_requirements(["torch", "yaml", "srt_no_such_module"]) == [
        f"torch=={version('torch').split('+')[0]}",
        f"PyYAML=={version('PyYAML')}",
        "srt-no-such-distribution",
    ]
