"""Build glue that pyproject.toml cannot express declaratively.

``kernels/`` lives at the top of the repository but ships as ``kvobs.kernels``
(a top-level ``kernels`` module would collide with the PyPI package of that name).

``dashboards/`` ships as ``kvobs.dashboards`` with its generated files as package data:
``kvobs report`` reads ``generated/*.json`` from there and never needs grafanalib.

``kvobs.kernels._native`` is a small C extension (plain CPython API, no torch headers,
no CUDA) with the block-copy loops. It is optional: where no C compiler exists the
install still succeeds and ``kvobs.kernels`` falls back to a pure-torch path.
"""

from setuptools import Extension, find_packages, setup

PACKAGES = [
    *find_packages(include=["kvobs", "kvobs.*"]),
    "kvobs.kernels",
    *(f"kvobs.kernels.{name}" for name in find_packages("kernels")),
    "kvobs.dashboards",
]

NATIVE_KERNELS = Extension(
    "kvobs.kernels._native",
    sources=["kernels/_native.c", "kernels/_hookcall.c"],
    depends=["kernels/_hookcall.h"],
    extra_compile_args=["-O3", "-std=c11"],
    optional=True,
)

setup(
    packages=PACKAGES,
    package_dir={"kvobs": "kvobs", "kvobs.kernels": "kernels", "kvobs.dashboards": "dashboards"},
    package_data={"kvobs.dashboards": ["generated/*.json", "rules/*.yaml"]},
    include_package_data=False,  # package_data above is the whole list
    ext_modules=[NATIVE_KERNELS],
)
