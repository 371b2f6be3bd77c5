#!/usr/bin/env bash
# The device command's rehearsal on a CPU (issue 40; `make device-rehearsal`; a slow test):
# a virtualenv holding only the device image's packages at its versions
# (benchmarks/device_image_requirements.txt, the CPU build of jaxlib; Python 3.12 like the
# image's 3.12.3), a copy of the working tree as the device tool sends it (tracked and
# untracked-not-ignored files, plus device_wheels/), no editable install, then
# `device_run.sh --smoke` end to end. Fails unless every part says ok and every file is written.
# Environment: DEVICE_PYTHON (a Python 3.12; default python3.12 or pyenv's newest 3.12),
# DEVICE_VENV (default workdir/device_image_venv, reused while the requirements are unchanged).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
req=benchmarks/device_image_requirements.txt
py=""
for cand in ${DEVICE_PYTHON:-} python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python; do
  if "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
    py=$cand; break
  fi
done
if [ -z "$py" ]; then
  echo "device_rehearsal: no Python 3.12 found (the image's is 3.12.3); set DEVICE_PYTHON" >&2
  exit 2
fi
[ -n "$(ls device_wheels/*.whl 2>/dev/null)" ] || { echo "device_rehearsal: run 'make device-wheels' first" >&2; exit 2; }
venv="${DEVICE_VENV:-$root/workdir/device_image_venv}"
stamp="$venv/.requirements"
if ! cmp -s "$req" "$stamp"; then
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q -r "$req"
  cp "$req" "$stamp"
fi
if (cd / && "$venv/bin/python" -c 'import sera_jax' 2>/dev/null); then
  echo "device_rehearsal: $venv can import sera_jax (an install): the image has none" >&2; exit 1
fi
tmp=$(mktemp -d /tmp/device_rehearsal.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
git ls-files -z -co --exclude-standard | xargs -0 -I{} sh -c 'test -f "{}" && echo "{}"' \
  | tar -cf - -T - | tar -xf - -C "$tmp"
mkdir -p "$tmp/tree/device_wheels"
cp device_wheels/*.whl "$tmp/tree/device_wheels/" 2>/dev/null || true
# The tree sits in $tmp/tree, as the device tool lays a copy of the repository root.
(cd "$tmp" && find . -mindepth 1 -maxdepth 1 ! -name tree -exec mv {} tree/ \;)
out="$tmp/out"
mkdir -p "$out"
env -u PYTHONPATH OUT="$out" PYTHON="$venv/bin/python" DEVICE_SITE="$tmp/site" \
  MAZE_WORKDIR="$tmp/maze" bash "$tmp/tree/benchmarks/device_run.sh" --smoke
status=0
for f in log.txt device.json accelerator.md accelerator.json maze.json maze.md; do
  [ -s "$out/$f" ] || { echo "device_rehearsal: $f was not written" >&2; status=1; }
done
if grep -E ': (FAILED|TIMEOUT)' "$out/log.txt" >&2; then status=1; fi
if grep -E '\*\*(FAILED|TIMEOUT)\*\*|total budget left' "$out/accelerator.md" >&2; then status=1; fi
n=$(ls "$out" | wc -l)
[ "$n" -le 8 ] || { echo "device_rehearsal: $n files in OUT (the tool brings back 8)" >&2; status=1; }
if [ -n "${REHEARSAL_KEEP:-}" ]; then rm -rf "$REHEARSAL_KEEP"; cp -r "$out" "$REHEARSAL_KEEP"; fi
[ "$status" = 0 ] && echo "device rehearsal passed: $(ls "$out" | tr '\n' ' ')"
exit $status
