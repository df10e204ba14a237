"""Builds the optional C++ CPU kernel of ``rfjax.ops.fwht`` (``csrc/fwht_cpu.cc``).

The kernel is a plain shared library (not a Python module) that ``rfjax.ops._fwht_cpu`` loads
with ctypes and registers with XLA through ``jax.ffi``. It needs a C++17 compiler and the XLA
FFI headers shipped with jaxlib (``jaxlib/include``; jaxlib is a build requirement). The build is
optional: when the headers or the compiler are missing or compilation fails, a warning is printed,
installation goes on, and ``fwht`` uses its pure-XLA fallback.

Environment:
  RFJAX_BUILD_FWHT_CPU=0   skip the kernel.
  RFJAX_FWHT_CPU_MARCH=... the -march value (default "native" when the compiler accepts it;
                           "none" for no -march flag, e.g. for portable wheels).
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent
EXT_NAME = "rfjax.ops._fwht_cpu_lib"


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


def _accepts_flag(compiler, flag: str) -> bool:
    """Whether the compiler compiles a small C++ file with ``flag``."""
    with tempfile.TemporaryDirectory() as tmp:
        source = pathlib.Path(tmp, "probe.cc")
        source.write_text("int main() { return 0; }\n")
        try:
            compiler.compile([str(source)], output_dir=tmp, extra_postargs=[flag])
        except Exception:
            return False
    return True


class OptionalBuildExt(build_ext):
    """build_ext that tunes flags for the compiler and never fails the installation."""

    def build_extension(self, ext):
        try:
            include = _jaxlib_include()
            if include is None:
                raise RuntimeError("jaxlib's XLA FFI headers (jaxlib/include) were not found")
            if self.compiler.compiler_type == "msvc":
                ext.include_dirs.append(include)
                ext.extra_compile_args = ["/std:c++17", "/O2", "/EHsc"]
            else:
                # -isystem: no warnings from the XLA headers
                flags = ["-std=c++17", "-O3", "-fvisibility=hidden", "-isystem", include]
                march = os.environ.get("RFJAX_FWHT_CPU_MARCH", "native")
                if march != "none" and _accepts_flag(self.compiler, f"-march={march}"):
                    flags.append(f"-march={march}")
                flags += [
                    f
                    for f in ("-Wno-attributes", "-Wno-maybe-uninitialized")
                    if _accepts_flag(self.compiler, f)
                ]
                ext.extra_compile_args = flags
            super().build_extension(ext)
        except Exception as error:  # the kernel is optional: fall back to pure XLA
            print(
                f"WARNING: rfjax's C++ FWHT kernel was not built ({error}); "
                "rfjax.ops.fwht will use its pure-XLA implementation on CPU.",
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
    ext_modules.append(
        Extension(
            EXT_NAME,
            sources=[str(pathlib.Path("csrc", "fwht_cpu.cc"))],
            depends=[str(pathlib.Path("csrc", "fwht_cpu.cc"))],
            language="c++",
        )
    )

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
