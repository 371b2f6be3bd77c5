#!/usr/bin/env bash
# The accelerator check (benchmarks/accelerator_check.py) from the repository root, with the
# project's virtualenv when there is one (else python3); flags pass through, e.g.
#   bash benchmarks/accelerator_check.sh --out=/tmp/accelerator_check.md
#   bash benchmarks/accelerator_check.sh --smoke
# The environment needs an accelerator build of jax (e.g. `pip install -U "jax[cuda12]"` or
# `"jax[tpu]"`); the check prints the device kind it found, so a CPU-only jax is visible.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="$root/.venv/bin/python"
[ -x "$python" ] || python=python3
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" benchmarks/accelerator_check.py "$@"
