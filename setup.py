"""Builds rfjax's optional C++ CPU kernels (``csrc/``): ``rfjax.ops.fwht``, ``hd_chain``,
``sin_cos`` and ``symmetric_rank_update``.

The kernels are a plain shared library (not a Python module) that ``rfjax.ops._fwht_cpu`` loads
with ctypes and registers with XLA through ``jax.ffi``. It needs a C++17 compiler and the XLA
FFI headers shipped with jaxlib (``jaxlib/include``; jaxlib is a build requirement). The build is
optional: when the headers or the compiler are missing or compilation fails, a warning is printed,
installation goes on, and the ops use their pure-XLA implementations.

Portability: nothing is compiled for the build machine's CPU (no ``-march=native``). The
kernels (``csrc/fwht_kernel.h``, ``csrc/sincos_kernel.h``) are compiled once per instruction set
into its own namespace (``csrc/fwht_isa.cc``): on x86-64 with GCC or Clang for AVX-512F
(``-mavx512f -mavx2 -mfma``), AVX2 (``-mavx2 -mfma``), SSE2 (the x86-64 baseline) and portable
scalar code; elsewhere scalar only. The library picks the best one the CPU supports when it is
loaded (``__builtin_cpu_supports``), so a wheel built on one x86-64 machine runs on any.

Environment:
  RFJAX_BUILD_FWHT_CPU=0   skip the kernel.
"""

from __future__ import annotations

import os
import pathlib
import platform
import sys
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent
EXT_NAME = "rfjax.ops._fwht_cpu_lib"
CSRC = pathlib.Path("csrc")
# Instruction sets compiled on x86-64 (GCC/Clang), best first, with their flags.
X86_ISAS = {
    "avx512": ["-mavx512f", "-mavx2", "-mfma"],
    "avx2": ["-mavx2", "-mfma"],
    "sse2": ["-msse2"],
}


def _jaxlib_include() -> str | None:
    """jaxlib's include directory (xla/ffi/api/ffi.h), without importing jax."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("jaxlib")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        include = pathlib.Path(location) / "include"
        if (include / "xla" / "ffi" / "api" / "ffi.h").is_file():
            return str(include)
    return None


def _accepts_flags(compiler, flags: list[str]) -> bool:
    """Whether the compiler compiles a small C++ file with ``flags``."""
    with tempfile.TemporaryDirectory() as tmp:
        source = pathlib.Path(tmp, "probe.cc")
        source.write_text("int main() { return 0; }\n")
        try:
            compiler.compile([str(source)], output_dir=tmp, extra_postargs=flags)
        except Exception:
            return False
    return True


def _is_x86_64() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


class OptionalBuildExt(build_ext):
    """build_ext that compiles one kernel object per instruction set and never fails the install."""

    def build_extension(self, ext):
        try:
            include = _jaxlib_include()
            if include is None:
                raise RuntimeError("jaxlib's XLA FFI headers (jaxlib/include) were not found")
            if self.compiler.compiler_type == "msvc":
                common = ["/std:c++17", "/O2", "/EHsc"]
                ext.include_dirs.append(include)
                isas = {}  # no run-time CPU detection with MSVC: the scalar kernel only
            else:
                # -isystem: no warnings from the XLA headers
                common = ["-std=c++17", "-O3", "-fvisibility=hidden"]
                # -ffp-contract=off: no fused multiply-adds the source does not write (the
                # sin/cos kernel evaluates rfjax.ops.sin_cos's arithmetic operation by operation)
                common += [
                    f
                    for f in ("-Wno-attributes", "-Wno-maybe-uninitialized", "-ffp-contract=off")
                    if _accepts_flags(self.compiler, [f])
                ]
                isas = X86_ISAS if _is_x86_64() else {}
                isas = {name: f for name, f in isas.items() if _accepts_flags(self.compiler, f)}
                ext.extra_compile_args = [*common, "-isystem", include]
            for name, flags in [*isas.items(), ("scalar", [])]:
                macros = [("RFJAX_ISA", name)] + ([("RFJAX_SCALAR", "1")] if not flags else [])
                ext.extra_objects += self.compiler.compile(
                    [str(CSRC / "fwht_isa.cc")],
                    output_dir=os.path.join(self.build_temp, f"isa_{name}"),
                    macros=macros,
                    include_dirs=[str(CSRC)],
                    extra_postargs=[*common, *flags],
                    depends=[str(CSRC / "fwht_kernel.h"), str(CSRC / "sincos_kernel.h")],
                )
                if flags:
                    ext.define_macros.append((f"RFJAX_HAVE_{name.upper()}", "1"))
            ext.include_dirs.append(str(CSRC))
            super().build_extension(ext)
        except Exception as error:  # the kernel is optional: fall back to pure XLA
            print(
                f"WARNING: rfjax's C++ FWHT kernel was not built ({error}); "
                "rfjax.ops.fwht will use its pure-XLA implementations on CPU.",
                file=sys.stderr,
            )

    def get_export_symbols(self, ext):
        return []  # a ctypes library, not a Python module: no PyInit_ symbol to export

    def run(self):
        try:
            super().run()
        except Exception as error:
            print(f"WARNING: rfjax's C++ extensions were not built ({error})", file=sys.stderr)


ext_modules = []
if os.environ.get("RFJAX_BUILD_FWHT_CPU", "1") != "0":
    headers = [
        str(CSRC / name)
        for name in ("fwht_kernel.h", "sincos_kernel.h", "fwht_kernel_api.h", "fwht_isa.cc")
    ]
    ext_modules.append(
        Extension(
            EXT_NAME,
            sources=[str(CSRC / "fwht_cpu.cc")],
            depends=headers,
            language="c++",
        )
    )

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
