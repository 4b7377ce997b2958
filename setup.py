"""Build glue that pyproject.toml cannot express declaratively.

``kernels/`` lives at the top of the repository but ships as ``kvobs.kernels``
(a top-level ``kernels`` module would collide with the PyPI package of that name).

``dashboards/`` ships as ``kvobs.dashboards`` with its generated files as package data:
``kvobs report`` reads ``generated/*.json`` from there and never needs grafanalib.

``kvobs.kernels._native`` is a C extension (plain CPython API, no torch headers, no CUDA):
the host block-copy loops, the vLLM block pool walk and the reuse, thrash and residency
cores, one file per concern in ``kernels/*.c``. It is required: the wheel carries it built,
and installing from the sdist needs a C compiler and the Python headers (the build says
so and stops where either is missing).
"""

from glob import glob

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import BaseError, CCompilerError

PACKAGES = [
    *find_packages(include=["kvobs", "kvobs.*"]),
    "kvobs.kernels",
    *(f"kvobs.kernels.{name}" for name in find_packages("kernels")),
    "kvobs.dashboards",
]

NATIVE_KERNELS = Extension(
    "kvobs.kernels._native",
    sources=sorted(glob("kernels/*.c")),
    depends=sorted(glob("kernels/*.h")),
    extra_compile_args=["-O3", "-std=c11", "-fvisibility=hidden"],
)


class BuildNative(build_ext):
    """build_ext, whose failure says what kvobs needs to build its extension."""

    def run(self) -> None:
        try:
            super().run()
        except (BaseError, CCompilerError) as exc:
            raise SystemExit(
                f"kvobs: building the C extension kvobs.kernels._native failed ({exc}). "
                "It is required: install a C compiler and the Python headers (Debian / "
                "Ubuntu: apt-get install gcc python3-dev), or install kvobs from a wheel."
            ) from exc


setup(
    packages=PACKAGES,
    package_dir={"kvobs": "kvobs", "kvobs.kernels": "kernels", "kvobs.dashboards": "dashboards"},
    package_data={"kvobs.dashboards": ["generated/*.json", "rules/*.yaml"]},
    include_package_data=False,  # package_data above is the whole list
    ext_modules=[NATIVE_KERNELS],
    cmdclass={"build_ext": BuildNative},
)
