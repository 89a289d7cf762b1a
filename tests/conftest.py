"""Strict JAX for every test: rank promotion raises, and two fake CPU devices exist so sharded code is exercised.

Compile time is most of a test's time (tiny models, a few steps each), so:
- compiled executables are shared across the whole run (both xdist workers and the subprocesses tests start)
  through JAX's persistent compilation cache, in a directory made fresh for each run: many tests build the same
  step for the same model and recipe (the contract's straight and resumed Trainers), and the second build then
  costs a trace instead of an XLA compile. Every compile is stored, the one-op programs of eager code too
  (model initializers, metrics, test code): each is a real XLA:CPU compile and the workers would otherwise
  compile the same ones several times (benchmarks/README.md, "Setup and suite", has the figures of these choices);
- tests compile without most XLA optimizations (``jax_disable_most_optimizations``) and with XLA:CPU's older
  elemental emitters in place of its fusion emitters (``--xla_cpu_use_fusion_emitters=false``), both inherited by
  the subprocesses tests start: together they compile several times as fast. Every assertion still holds (bitwise
  equalities compare runs of one build; parity tolerances are the fixed ones). The SIGKILL-and-autoresume runs
  (tests/trainer/test_fault_injection.py) compile as users do, optimized and with the default emitters, so bitwise
  resume is still checked in the configuration users run;
- XLA:CPU emits each program as one LLVM module (``--xla_cpu_parallel_codegen_split_count=1``) instead of splitting
  it to compile the parts on parallel threads: with the cores already busy with the workers the split buys no
  wall time and costs CPU time (each part repeats shared work);
- the lowerings of a test process share MLIR contexts (``_share_mlir_contexts``, below);
- the bridge's op tables compile once per table, not once per row (tests/torch_bridge/parity.py, ``JitTable``);
- torch runs one OpenMP thread per process (below).
"""
import gc
import os
import shutil
import tempfile
import threading

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# torch's OpenMP pool sized to one thread in each test process (xdist workers and the subprocesses they start): the
# workers would otherwise oversubscribe the cores with spinning OpenMP threads for ops on tiny tensors
os.environ.setdefault("OMP_NUM_THREADS", "1")
# tests only: the fault-injection runs drop them (they compile as users do)
FAST_COMPILE_FLAGS = ("--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1")
flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in flags:
    flags += " --xla_force_host_platform_device_count=2"
for flag in FAST_COMPILE_FLAGS:
    if flag.split("=")[0] not in flags:
        flags += " " + flag
os.environ["XLA_FLAGS"] = flags.strip()

_CACHE_ENV = "JAXCOMPOSER_TEST_COMPILE_CACHE"
if _CACHE_ENV not in os.environ:  # the controller (or a lone pytest) makes it; xdist workers inherit it
    os.environ[_CACHE_ENV] = tempfile.mkdtemp(prefix="jaxcomposer-test-xla-")
    _OWNS_CACHE = True
else:
    _OWNS_CACHE = False
# JAX reads these at its first compile, in this process and in subprocesses the tests start
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ[_CACHE_ENV]
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
# conv_impl='auto' pinned to oneDNN where it can run (as the bridge always ran, and the configs): a test's result must
# not depend on a timing; tests/torch_bridge/test_conv_autotune.py sets its own policy and cache
os.environ.setdefault("JAXCOMPOSER_CONV_AUTOTUNE", "onednn")
os.environ.setdefault("JAXCOMPOSER_CONV_AUTOTUNE_CACHE", os.path.join(os.environ[_CACHE_ENV], "conv_autotune"))

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
# Tracing allocates millions of short-lived objects (tracers, equations, avals): CPython's default threshold (700)
# makes a test process collect so often that the collector takes a visible share of its time
gc.set_threshold(10_000, 20, 100)


def _share_mlir_contexts(lowerings_per_context: int = 100) -> None:
    """Let each thread's lowerings share an MLIR context, a new one every ``lowerings_per_context``.

    JAX makes a fresh context for every lowering (``mlir.make_ir_context`` registers and loads every dialect), and
    the suite lowers thousands of programs, most of them one-op programs of eager code whose whole lowering costs
    about as much as that. JAX's lowering caches also keep each lowered module, and with it its context, alive:
    sharing saves CPU time and memory. A context only ever holds what its modules uniqued (types,
    attributes), so replacing it every 100 lowerings bounds that. Per thread, because an MLIR context is not safe to
    use from two threads at once. (jax is pinned: this patches its ``jax._src.interpreters.mlir``, which calls
    ``make_ir_context`` through its module globals.)
    """
    from jax._src.interpreters import mlir

    make_context = mlir.make_ir_context
    local = threading.local()

    def shared_context():
        uses = getattr(local, "uses", 0)
        if uses % lowerings_per_context == 0:
            local.context = make_context()
        local.uses = uses + 1
        return local.context

    mlir.make_ir_context = shared_context


_share_mlir_contexts()


def pytest_collection_modifyitems(config, items):
    # the long work first, so that no worker ends the run alone on it: the slow tests (subprocess runs, notebooks),
    # then the files held on one worker (xdist_group: minutes of export and compile each), then the rest
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None,
                                 item.get_closest_marker("xdist_group") is None))


def pytest_collection_finish(session):
    # everything imported by now (jax, torch, transformers, the test modules) lives until the end: out of the
    # collector's sight, full collections stop walking it again and again
    gc.freeze()
    # ``--dist loadgroup`` keeps a file's module-level caches (bridged zoo models, op tables) on one worker by tagging
    # node ids with ``@group``; pytest 9.2 moved node ids where pytest-xdist 3.8 no longer writes, so every worker
    # silently rebuilt every cache (the op tables and the zoo three times over). Fail loudly if that comes back.
    config = session.config
    if getattr(config.option, "loadgroup", False):
        untagged = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
        if untagged:
            raise pytest.UsageError(f"--dist loadgroup did not tag {untagged[0]} (and {len(untagged) - 1} more) "
                                    "with its xdist_group: this pytest / pytest-xdist pair breaks grouping")


def pytest_unconfigure(config):
    if _OWNS_CACHE and not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ[_CACHE_ENV], ignore_errors=True)


@pytest.fixture
def key():
    return jax.random.PRNGKey(0)
