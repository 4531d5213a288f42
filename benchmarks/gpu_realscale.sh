#!/usr/bin/env bash
# The real-scale suite on one GPU at sizes that fill it (issue 14): each realscale.py model in its
# own process, side by side, its batch scaled so that its hand-written policies fit an 80 GiB H100
# and its no-remat step does not (scales from the batch-1x H100 run, gpu-h100-realscale.md), and
# xla_remat.py beside them (does XLA's own remat pass touch the steps over the device's memory?).
#
#   bash benchmarks/gpu_realscale.sh OUTDIR [SECONDS per process, default 480]
#
# Writes OUTDIR/<model>.md (row by row, so a process stopped by the time limit keeps its rows),
# OUTDIR/<model>.log, OUTDIR/xla_remat.md and OUTDIR/status (each process's exit code; 124: timed out).
set -u
out=${1:?usage: gpu_realscale.sh OUTDIR [SECONDS per process]}
limit=${2:-480}
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
run() {
  timeout "$limit" "$py" "$here/realscale.py" --models "$1" --batch-scale "$2" --out "$out/$1.md" >"$out/$1.log" 2>&1
  echo "$1 exit $?" >>"$out/status"
}
for m in llama:3 gpt:3 llama_scan:3 gpt_scan:3 equinox:6 flax_scan:6 haiku_scan:6 resnet_flax:24; do
  run "${m%%:*}" "${m##*:}" &
done
(timeout "$limit" "$py" "$here/xla_remat.py" --scales 3 4 --policies none dots_saveable >"$out/xla_remat.md" 2>"$out/xla_remat.log"
 echo "xla_remat exit $?" >>"$out/status") &
wait
