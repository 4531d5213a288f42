#!/usr/bin/env bash
# The real-scale suite on one GPU at sizes that fill it (issue 14): each realscale.py model in its
# own process, JOBS (default 4) side by side, its batch scaled so that its hand-written policies
# fit an 80 GiB H100 and its no-remat step does not (scales from the batch-1x H100 run,
# gpu-h100-realscale.md); then xla_remat.py (does XLA's own remat pass touch the steps over the
# device's memory?).  Nine processes at once ran the H100 out of memory in XLA's GEMM autotuning
# (gpu-h100-realscale-fill.md); four at once did not.
#
#   bash benchmarks/gpu_realscale.sh OUTDIR [SECONDS per process, default 480]
#   MODELS="gpt:3 resnet_flax:24" XLA_REMAT=0 bash benchmarks/gpu_realscale.sh OUTDIR   # some models (model:scale), no xla_remat.py
#
# Writes OUTDIR/<model>.md (row by row, so a process stopped by the time limit keeps its rows),
# OUTDIR/<model>.log (with the planner's progress), OUTDIR/xla_remat.md and OUTDIR/status (each
# process's exit code; 124: timed out).
set -u
out=${1:?usage: gpu_realscale.sh OUTDIR [SECONDS per process]}
limit=${2:-480}
export PY=${PYTHON:-python3} HERE=$(cd "$(dirname "$0")" && pwd) OUTDIR=$out LIMIT=$limit
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
mkdir -p "$out"
one() {  # model:scale
  local m=${1%%:*} k=${1##*:}
  timeout "$LIMIT" "$PY" "$HERE/realscale.py" --models "$m" --batch-scale "$k" --planner-log \
    --out "$OUTDIR/$m.md" >"$OUTDIR/$m.log" 2>&1
  echo "$m exit $?" >>"$OUTDIR/status"
}
export -f one
printf '%s\n' ${MODELS:-llama:3 gpt:3 equinox:6 resnet_flax:24 llama_scan:3 gpt_scan:3 flax_scan:6 haiku_scan:6} |
  xargs -P "${JOBS:-4}" -I{} bash -c 'one {}'
[ "${XLA_REMAT:-1}" = 0 ] && exit 0
timeout "$limit" "$PY" "$HERE/xla_remat.py" --scales 3 4 --policies none dots_saveable >"$out/xla_remat.md" 2>"$out/xla_remat.log"
echo "xla_remat exit $?" >>"$out/status"
