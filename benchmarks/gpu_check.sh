#!/usr/bin/env bash
# GPU check for kvobs.kernels, for a host with a CUDA GPU (none in CI). Under 5 minutes.
#
#   1. the CUDA tests (tests/kernels/test_cuda_device.py: byte-exact swaps in both
#      directions and strategies, event timing, stream ordering) and the CPU suite;
#   2. the GPU benchmark: swap out (d2h) and swap in (h2d) GB/s of kvobs, of a per-block
#      copy_ loop, and of one pinned cudaMemcpyAsync of the same bytes, side by side.
#
# Needs a CUDA build of torch in the venv and the package installed (`pip install -e .`,
# which also builds the C extension). Usage: benchmarks/gpu_check.sh [path/to/python]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"

"$PY" - <<'PYEOF'
import sys
import torch
import kvobs.kernels as k
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA GPU; install a CUDA build of torch")
print(f"gpu_check: torch {torch.__version__}, {torch.cuda.get_device_name(0)}, "
      f"kvobs.kernels from {k.__file__}")
PYEOF

echo "== tests (CUDA and CPU)"
timeout 120 "$PY" -m pytest -q -rs tests/kernels

echo "== GPU benchmark (d2h = swap out, h2d = swap in; memcpy = pinned cudaMemcpyAsync)"
timeout 150 "$PY" benchmarks/swap_bandwidth.py --device cuda --rounds 5 --budget-ms 5
