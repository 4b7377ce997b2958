# syntax=docker/dockerfile:1
# vLLM's OpenAI server with kvobs added: the image examples/vllm-values.yaml and
# examples/vllm-multiprocess-values.yaml run. vLLM finds the kvobs plugin through its
# `vllm.general_plugins` entry point; KVOBS_ENABLE=1 in the pod switches it on.
#
# kvobs is not on the package index yet: this installs the sdist that `make dist` builds
# (it fits any platform and Python; with no C compiler in the image kvobs uses its
# pure-torch copy fallback). Build with dist/ as the context, from the repository root:
#
#   make dist
#   docker build -f helm/kvobs/examples/vllm.Dockerfile -t REGISTRY/vllm-openai-kvobs:v0.33.0 dist
#   docker push REGISTRY/vllm-openai-kvobs:v0.33.0
#
# pip keeps the image's torch and vLLM and adds only the small runtime dependencies of
# kvobs the image lacks (structlog, OpenTelemetry, prometheus-client).

ARG VLLM_IMAGE=vllm/vllm-openai:v0.33.0
FROM ${VLLM_IMAGE}
COPY kvobs-*.tar.gz /tmp/kvobs/
RUN pip install --no-cache-dir --disable-pip-version-check /tmp/kvobs/kvobs-*.tar.gz \
    && rm -rf /tmp/kvobs
