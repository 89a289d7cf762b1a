"""benchmarks/gpu_suite.py end to end in its --cpu-smoke mode: tiny shapes, in this process, on the CPU.

It checks the script, not speed: every section writes every side with a positive throughput and a finite loss
(torch.compile is skipped in a smoke run, with its reason), and the goal fields are there.
"""
import gzip
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_suite.py"


def load_suite():
    spec = importlib.util.spec_from_file_location("gpu_suite", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # long compiles on one worker: scheduled first (conftest), so no worker ends the run on it
def test_cpu_smoke_writes_every_section(tmp_path):
    suite = load_suite()
    out = tmp_path / "x.json"
    assert suite.main(["--cpu-smoke", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["smoke"] is True and set(result["sections"]) == set(suite.SECTIONS)
    expected_sides = {"resnet50": {"jaxcomposer", "torch_eager", "torch_compile"},
                      "gpt2": {"jaxcomposer", "torch_eager", "torch_compile"},
                      "bridged_resnet50": {"bridged", "bridged_nchw", "plain_flax"}}
    for name, section in result["sections"].items():
        assert "error" not in section, section.get("error")
        sides = section["sides"]
        assert set(sides) == expected_sides[name]
        for side, rec in sides.items():
            if side == "torch_compile":
                assert rec["status"] == "skipped" and "--cpu-smoke" in rec["reason"]
                continue
            assert rec["status"] == "ok", rec
            assert rec["median_items_per_s"] > 0 and all(x > 0 for x in rec["items_per_s"])
            assert math.isfinite(rec["final_loss"])
            assert "mfu" in rec and "memory" in rec
            if not side.startswith("torch"):  # the JAX sides say what their matmuls ran in: fp32 in a smoke run
                assert set(rec["matmul_operand_dtypes"]) == {"float32"} and rec["matmul_operand_dtypes"]["float32"]
        assert section["flops_per_item"] > 0
        goal = section["goal"]
        assert {"goal", "target", "value", "pass"} <= set(goal) and isinstance(goal["pass"], bool)
    assert result["sections"]["gpt2"]["sides"]["jaxcomposer"]["attention_impl"] == "xla"
    ratios = result["sections"]["resnet50"]["ratios"]
    assert ratios["jaxcomposer_over_torch_eager"] > 0 and ratios["jaxcomposer_over_torch_compile"] is None
    assert result["sections"]["bridged_resnet50"]["ratios"]["bridged_over_plain_flax"] > 0
    assert result["sections"]["bridged_resnet50"]["ratios"]["bridged_nchw_over_plain_flax"] > 0
    for section, side in (("resnet50", "jaxcomposer"), ("gpt2", "jaxcomposer"), ("bridged_resnet50", "bridged_nchw")):
        assert result["sections"][section]["sides"][side]["compiled_step_bytes"]["argument"] > 0
    assert result["cross_section_ratios"]["bridged_over_native_trainer"] > 0


@pytest.mark.slow  # a trace, and a child process that compiles again
def test_gpu_profile_cpu_smoke_traces_and_times_a_variant(tmp_path, monkeypatch):
    """benchmarks/gpu_profile.py: the GPT side's trace is read back (kernel lines with busy time, a top list and
    idle gaps), its HLO is written, and a variant child process times the same side."""
    load_suite()  # gpu_profile imports it by name
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("gpu_profile", SCRIPT.parent / "gpu_profile.py")
    profile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(profile)
    assert profile.main(["--profile", "--variants", "--cpu-smoke", "--sections", "gpt2", "--only", "gpt2/base",
                         "--steps", "1", "--rounds", "1", "--warmup", "1", "--trace-steps", "2",
                         "--out-dir", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "gpu_profile_xla_flag_variants.smoke.json").read_text())
    prof = result["profiles"]["gpt2"]
    assert prof["timing"]["median_items_per_s"] > 0 and "error" not in prof["trace"]
    lines = prof["trace"]["lines"]
    busiest = max(lines.values(), key=lambda line: line["busy_ms_per_step"])
    assert busiest["busy_ms_per_step"] > 0 and busiest["top"] and busiest["top"][0]["ms_per_step"] > 0
    assert {"under_5us", "5_to_50us", "over_50us", "largest_us"} <= set(busiest["gaps"])
    with gzip.open(tmp_path / "gpu_profile_hlo.txt.gz", "rt") as f:
        hlo = f.read()
    assert hlo.startswith("==== gpt2: the compiled train step\nHloModule")
    variant = result["variants"]["gpt2/base"]
    assert variant["status"] == "ok", variant.get("stderr_tail")
    assert variant["median_items_per_s"] > 0 and variant["section"] == "gpt2"
