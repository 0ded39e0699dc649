"""Builds the compiled kernels (DENSE sampler, CSC builder, block reader, edge phase, partitioner); all
metadata lives in pyproject.toml.

``graphstore/sample/_native/dense.c`` (and ``graphstore/buffer/_native/csc.c``) is plain C99 with no Python or torch headers, loaded
with ctypes (`graphstore.sample._native`), so building it needs only a C compiler: not
torch, not Python's headers beyond what setuptools already uses. It is an *optional*
extension: without a compiler, ``pip install`` still succeeds (setuptools prints a warning)
and the sampler runs its torch code instead.
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildCtypesLibrary(build_ext):
    """build_ext for a library loaded with ctypes rather than imported as a module."""

    def get_export_symbols(self, ext):
        # The default asks the linker to export PyInit_<name>, which a ctypes library does
        # not define (MSVC fails the link on it); dense.c marks its own exports.
        return ext.export_symbols

    def build_extension(self, ext):
        if self.compiler.compiler_type == "unix":
            # -O3 for the hop loop's inlining and unswitching; hidden visibility so only the
            # GS_EXPORT functions are public. No -march: a wheel must run on any x86-64/arm64.
            ext.extra_compile_args = ["-std=c99", "-O3", "-fvisibility=hidden"]
        elif self.compiler.compiler_type == "msvc":
            ext.extra_compile_args = ["/O2"]
        super().build_extension(ext)


setup(
    ext_modules=[
        Extension("graphstore.sample._native._dense", sources=["graphstore/sample/_native/dense.c"],
                  optional=True),
        Extension("graphstore.buffer._native._csc", sources=["graphstore/buffer/_native/csc.c"],
                  optional=True),
        Extension("graphstore.layout._native._rowsets", sources=["graphstore/layout/_native/rowsets.c"],
                  optional=True),
        Extension("graphstore.layout._native._edges", sources=["graphstore/layout/_native/edges.c"],
                  optional=True),
        Extension("graphstore.layout._native._partition", sources=["graphstore/layout/_native/partition.c"],
                  optional=True),
    ],
    cmdclass={"build_ext": BuildCtypesLibrary},
)
