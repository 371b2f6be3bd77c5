#!/usr/bin/env bash
# The one device command (docs/DEVELOPING.md "Device runs"): pass it as is to the
# device tool, carrying device_wheels/ (`make device-wheels`):
#
#   bash benchmarks/device_run.sh            # on the GPU machine; writes into $OUT
#   bash benchmarks/device_run.sh --smoke    # tiny shapes on a CPU (`make device-rehearsal`)
#
# In order, each part under its own wall-clock budget (the whole <= 9 min; a part cut by its
# budget keeps what it wrote, and the next part still runs):
#   1. installs the carried wheels into $DEVICE_SITE (pip --no-index --no-deps --target);
#   2. prints the device, jax version and memory             -> $OUT/device.json
#   3. the accelerator check: bf16 matmul peak, sampler tokens/s, train-step MFU, attention
#      (dot_product vs plain)                                 -> $OUT/accelerator.{md,json}
#   4. the GPU maze study (configs/maze/gpu17.py): SFT, uniform + SERA, the null, eval
#                                                             -> $OUT/maze.json, maze.md
# and the whole console log -> $OUT/log.txt (at most 6 files).
# Environment: PYTHON (default python3: the image's), OUT (default workdir/device_out),
# DEVICE_SITE (default /tmp/sera_device_site), MAZE_WORKDIR (default /tmp/sera_maze_gpu).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
smoke=0
for arg in "$@"; do
  case "$arg" in
    --smoke) smoke=1 ;;
    *) echo "device_run.sh: unknown argument '$arg' (the only one is --smoke)" >&2; exit 2 ;;
  esac
done
PY="${PYTHON:-python3}"
OUT="${OUT:-$root/workdir/device_out}"
site="${DEVICE_SITE:-/tmp/sera_device_site}"
maze_wd="${MAZE_WORKDIR:-/tmp/sera_maze_gpu}"
mkdir -p "$OUT"
log="$OUT/log.txt"
: > "$log"
t0=$(date +%s)
say() { echo "[device_run +$(( $(date +%s) - t0 ))s] $*" | tee -a "$log"; }
# run NAME SECONDS CMD...: one part, killed at its budget; its output goes to the log.
run() {
  local name=$1 budget=$2; shift 2
  say "$name: start (budget ${budget} s)"
  timeout --kill-after=10 "$budget" "$@" 2>&1 | grep -v -E '^[IW][0-9]{4} ' | tee -a "$log"
  local code=${PIPESTATUS[0]}
  if [ "$code" = 124 ] || [ "$code" = 137 ]; then say "$name: TIMEOUT after ${budget} s";
  elif [ "$code" != 0 ]; then say "$name: FAILED (exit $code)"; else say "$name: ok"; fi
  return 0
}

if [ "$smoke" = 1 ]; then
  maze_cfg=configs/maze/gpu17_tiny.py; smoke_flag=--smoke
  b_accel=240; b_sft=120; b_rl=300; b_eval=120
  accel_budgets="--budgets=device=60,sampler_smollm2=60,train_smollm2=60,attention=60"
else
  maze_cfg=configs/maze/gpu17.py; smoke_flag=
  # Measured on an H200 (results/device/2026-12-04_h200): the maze stages took 107 s (SFT),
  # 72 + 54 + 46 s (three RL processes, ≈ 15 s of start-up each) and 9 s; the sampler 34 s.
  b_accel=185; b_sft=125; b_rl=205; b_eval=25
  accel_budgets="--budgets=device=20,sampler_smollm2=45,train_smollm2=60,attention=55"
fi

# 1. The wheels the image lacks (benchmarks/device_wheels.txt).
shopt -s nullglob
wheels=(device_wheels/*.whl)
if [ ${#wheels[@]} = 0 ]; then
  say "no wheels in $root/device_wheels: run 'make device-wheels' here and carry device_wheels"
  exit 2
fi
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site" "${wheels[@]}" 2>&1 | tee -a "$log"
export PYTHONPATH="$root:$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
say "installed ${#wheels[@]} wheels into $site; python $("$PY" -c 'import sys; print(sys.version.split()[0])')"

# 2. Device, versions, memory.
run device 60 "$PY" benchmarks/device_info.py --out="$OUT/device.json"

# 3. The accelerator check (the maze smoke part is replaced by the study below).
run accelerator "$b_accel" "$PY" benchmarks/accelerator_check.py $smoke_flag \
  --parts=device,sampler_smollm2,train_smollm2,attention $accel_budgets \
  --total_budget_s=$((b_accel - 5)) --out="$OUT/accelerator.md" --json_out="$OUT/accelerator.json"

# 4. The GPU maze study, stage by stage (each resumes: a re-run continues where it stopped).
M=("$PY" -m experiments.maze --config="$maze_cfg" --workdir="$maze_wd")
run maze_sft "$b_sft" "${M[@]}" --stage=sft
# The config as pre-registered (an override of compare.* would be refused): one process
# runs uniform, SERA, then the null (seed-major), sharing its compiled programs.
run maze_rl "$b_rl" "${M[@]}" --stage=rl
run maze_eval "$b_eval" "${M[@]}" --stage=eval
run maze_summary 60 "$PY" benchmarks/device_maze_summary.py --config="$maze_cfg" \
  --workdir="$maze_wd" --out="$OUT/maze.json"
[ -f "$maze_wd/results/comparison.md" ] && cp "$maze_wd/results/comparison.md" "$OUT/maze.md"
say "done; files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
# The files brought back name no machine's folders (they may be committed under results/):
# the folders printed become the variables above, the checkout's paths repository-relative.
for f in "$log" "$OUT/maze.md"; do
  if [ -f "$f" ]; then
    sed -i -e "s#$OUT#\$OUT#g" -e "s#$maze_wd#\$MAZE_WORKDIR#g" -e "s#$site#\$DEVICE_SITE#g" \
      -e "s#$root/##g" "$f"
  fi
done
