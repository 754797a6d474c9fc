"""Every SIMD intrinsic of the Rust kernels is inlined into its kernel.

An intrinsic reached through a closure that the compiler does not inline (`std::array::from_fn`
is one) runs without the kernel's target features: it becomes a call that passes each vector
through memory. Q5_0's few-row AVX-512 kernel ran that way at 2 to 15 rows, 14 times slower
than inlined, with every result still right; no other test can see it. The built extension's
machine code shows it: a call into `core::core_arch` (from the closure's function, not the
kernel's). The standard library's own feature detection calls one (`xgetbv`), and may.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from srt import _rust

FUNCTION = re.compile(r"^[0-9a-f]+ <(?P<name>.+)>:$")
CALL = re.compile(r"\bcall\s+[0-9a-f]+ <(?P<target>[^>]+)>")


STANDARD_DETECTION = ("std_detect", "compiler_builtins")


def calls_into_intrinsics(disassembly: str) -> list[tuple[str, str]]:
    """(caller, callee) for each call into `core_arch` but the standard detection's."""
    found, function = [], ""
    for line in disassembly.splitlines():
        if match := FUNCTION.match(line):
            function = match["name"]
            continue
        call = CALL.search(line)
        standard = any(name in function for name in STANDARD_DETECTION)
        if call and "core_arch" in call["target"] and not standard:
            found.append((function, call["target"]))
    return found


def test_a_call_into_an_intrinsic_is_found() -> None:
    disassembly = (
        "0000000000312400 <_ZN11srt_kernels5quant6packed4vnni3run17hce47E>:\n"
        "  312410:\tcall   312460 <_ZN4core5array11try_from_fn17h0c42E>\n"
        "0000000000312460 <_ZN4core5array11try_from_fn17h0c42E>:\n"
        "  312493:\tcall   132c20 <_RNvNtNtNtCs1_4core9core_arch3x867avx512f16_mm512_and_si512>\n"
        "0000000000400000 <_ZN10std_detect6detect5cache21detect_and_initialize>:\n"
        "  400010:\tcall   132c00 <_RNvNtNtNtCs1_4core9core_arch3x865xsave7_xgetbv>\n"
    )
    assert calls_into_intrinsics(disassembly) == [
        (
            "_ZN4core5array11try_from_fn17h0c42E",
            "_RNvNtNtNtCs1_4core9core_arch3x867avx512f16_mm512_and_si512",
        )
    ]


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs objdump (binutils)")
def test_no_kernel_calls_an_intrinsic() -> None:
    assert _rust.__file__ is not None
    disassembly = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", _rust.__file__],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert calls_into_intrinsics(disassembly) == []
