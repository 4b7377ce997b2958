# syntax=docker/dockerfile:1
# The kvobs image the Helm chart runs (`kvobs demo`). Build from the repository root:
#
#   docker build -t kvobs:0.1.0 .
#   docker run --rm -p 9464:9464 kvobs:0.1.0        # then: curl localhost:9464/metrics
#
# Two stages: the first compiles the optional C copy kernels and installs kvobs into a
# virtual environment; the second copies only that environment onto a slim Python and
# runs it as an unprivileged numeric user (65532), which the chart's runAsNonRoot needs.
# Nothing is written at run time outside /tmp, so the root filesystem can be read-only.
#
# kvobs itself is installed from this checkout (it is not on the package index yet).
# The demo's reference pool runs on torch. From the default package index, torch for
# x86_64 Linux brings the CUDA libraries (several GB); for a much smaller CPU-only image
# install torch from PyTorch's CPU wheel index (the URL PyTorch's install selector gives
# for CPU), as `make` does with the same variable:
#
#   docker build --build-arg TORCH_INDEX_URL=<PyTorch CPU wheel index> -t kvobs:0.1.0 .
#
# Build arguments:
#   PYTHON_VERSION       base image tag (default 3.11-slim-bookworm)
#   KVOBS_EXTRAS         pip extras (default "torch,fleet"; "torch,fleet,nvml" adds GPU memory gauges)
#   TORCH_VERSION        the torch installed first (default 2.13.0, the tested one)
#   TORCH_INDEX_URL      where that torch comes from (default: pip's own configuration)
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL   read by pip in the build stage only

ARG PYTHON_VERSION=3.11-slim-bookworm

FROM python:${PYTHON_VERSION} AS build
# A C compiler for kvobs.kernels._native (required: the install fails without one).
# Build stage only, so the compiler's exact Debian version does not matter (DL3008).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
ARG KVOBS_EXTRAS="torch,fleet"
ARG TORCH_VERSION="2.13.0"
ARG TORCH_INDEX_URL=""
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
RUN python -m venv /opt/kvobs \
    && /opt/kvobs/bin/pip install --no-cache-dir --disable-pip-version-check \
        ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY kvobs ./kvobs
COPY kernels ./kernels
COPY dashboards ./dashboards
# The C extension is required: a base image without Python's headers or gcc fails the
# install, and the import after it checks the extension loads (-I: the sources in the
# working directory would shadow the package).
RUN /opt/kvobs/bin/pip install --no-cache-dir --disable-pip-version-check \
        ".${KVOBS_EXTRAS:+[$KVOBS_EXTRAS]}" \
    && /opt/kvobs/bin/python -I -c "from kvobs.kernels._ext import native"

FROM python:${PYTHON_VERSION}
LABEL org.opencontainers.image.title="kvobs" \
      org.opencontainers.image.description="Observability for tiered KV caches in LLM inference engines" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/kvobs /opt/kvobs
ENV PATH=/opt/kvobs/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 65532:65532
EXPOSE 9464
ENTRYPOINT ["kvobs"]
CMD ["demo", "--metrics-addr", "0.0.0.0:9464"]
