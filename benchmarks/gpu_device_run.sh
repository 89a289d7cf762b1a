#!/usr/bin/env bash
# The lent GPU machine's whole command for benchmarks/gpu_suite.py, so one call does everything (the machine is
# bare, and device time is short). Carry `.whl` (made here by `make gpu-wheels`). Then, from the repository root:
#
#     bash benchmarks/gpu_device_run.sh [gpu_suite.py options ...]
#
# 1. Installs the carried wheels offline (pydantic and its three companions; nothing comes from the network).
# 2. Checks the suite end to end on that machine's CPU with its own JAX and flax (--cpu-smoke, tiny shapes, ~30 s):
#    its versions are newer than the ones this project pins, and a failure there would waste the GPU run. When the
#    check fails, flax, optax and orbax-checkpoint at the project's pinned versions (carried in .whl/pinned) are
#    installed over them and the check runs again. GPU_SUITE_CHECK=0 skips the check (a rerun on versions that
#    passed it).
# 3. Runs the full suite on the GPU. Results and logs go to $OUT (the device tool's folder that comes back; when
#    it is unset, /tmp/gpu_suite_out): gpu_suite.json, suite.log, smoke.json, smoke.log, versions.txt.
# 4. Then, unless GPU_PROFILE=0, traces the suite's two Trainer steps (benchmarks/gpu_profile.py --profile, ~80 s,
#    at most GPU_PROFILE_S seconds, 150 by default): gpu_profile.json, profile.log and the steps' optimized HLO.
set -u
out=${OUT:-/tmp/gpu_suite_out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
py=${PYTHON:-python3}
pip_offline() { $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "$@"; }

pip_offline .whl/*.whl || { echo "installing the carried wheels failed (carry .whl: make gpu-wheels)"; exit 3; }
versions() {
  { nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
    $py -c "import jax, flax, optax, orbax.checkpoint as oc, torch, pydantic; print('jax', jax.__version__, 'flax', \
flax.__version__, 'optax', optax.__version__, 'orbax', oc.__version__, 'torch', torch.__version__, 'pydantic', \
pydantic.VERSION)"; } 2>&1 | tee -a "$out/versions.txt"
}
smoke() { JAX_PLATFORMS=cpu timeout 180 $py benchmarks/gpu_suite.py --cpu-smoke --precision bf16 \
  --out "$out/smoke.json" > "$out/smoke.log" 2>&1; }

versions
if [ "${GPU_SUITE_CHECK:-1}" = 0 ]; then
  echo "== CPU check skipped (GPU_SUITE_CHECK=0)"
elif ! smoke; then
  tail -n 25 "$out/smoke.log"
  echo "== the CPU check failed with this machine's flax/optax/orbax; installing the pinned ones (.whl/pinned)"
  pip_offline .whl/pinned/*.whl || exit 3
  versions
  smoke || { tail -n 25 "$out/smoke.log"; echo "== the CPU check failed again; the GPU run goes on regardless"; }
fi
[ -f "$out/smoke.log" ] && echo "== CPU check: $(tail -n 1 "$out/smoke.log")"
$py benchmarks/gpu_suite.py --out "$out/gpu_suite.json" "$@" 2> >(tee "$out/suite.log" >&2)
if [ "${GPU_PROFILE:-1}" != 0 ]; then
  echo "== per-kernel profile of the Trainer steps (gpu_profile.py)"
  timeout "${GPU_PROFILE_S:-150}" $py benchmarks/gpu_profile.py --profile --out-dir "$out" 2> "$out/profile.log" | tail -n 40
fi
