"""Build glue that pyproject.toml cannot express declaratively.

``kernels/`` lives at the top of the repository but ships as ``kvobs.kernels``
(a top-level ``kernels`` module would collide with the PyPI package of that name).
"""

from setuptools import find_packages, setup

PACKAGES = [
    *find_packages(include=["kvobs", "kvobs.*"]),
    "kvobs.kernels",
    *(f"kvobs.kernels.{name}" for name in find_packages("kernels")),
]

setup(
    packages=PACKAGES,
    package_dir={"kvobs": "kvobs", "kvobs.kernels": "kernels"},
)
