"""The oneDNN kernels' numerics on an AVX2-only CPU, run here by capping the ISA (oneDNN's ``ONEDNN_MAX_CPU_ISA``,
ATen's ``ATEN_CPU_CAPABILITY``, XLA:CPU's ``--xla_cpu_max_isa``) in a subprocess: CI machines of either class check
both. There ATen's bfloat16 convolutions are not exact, so the calls must take the float32 path
(``torch_bridge.kernels.bf16_is_exact``)."""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def _capped_env() -> dict:
    env = {**os.environ, **AVX2}
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_max_isa=AVX2").strip()
    env.pop("PYTEST_XDIST_WORKER", None)
    return env


@pytest.mark.slow  # a subprocess: scheduled first
def test_onednn_numerics_hold_with_the_isa_capped_to_avx2():
    probe = subprocess.run([sys.executable, "-c", "import torch_bridge.kernels as k; print(k.bf16_is_exact())"],
                           env=_capped_env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert probe.stdout.strip().splitlines()[-1] == "False"  # the float32 path is the one exercised below
    # the numerics (values, gradients, bfloat16, a whole model against XLA's convolutions); the thread and OpenMP
    # tests do not depend on the ISA
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                          "tests/torch_bridge/test_onednn_conv.py", "-k", "not openmp_team and not one_thread"],
                         env=_capped_env(), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
