"""The optional C speedups (``bookkeeper_py._speedups``, issue 21): built by a normal
install where a C compiler and the Python headers are at hand; where the build fails the
install goes on and the pure-Python path is used (``optional=True``). Everything else is in
pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "bookkeeper_py._speedups",
            ["src/bookkeeper_py/_speedups.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
