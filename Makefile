# make demo: set up .venv and train the quickstart recipe.  make test: set up .venv and run the test suite.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
FMNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz

.PHONY: demo test test-fast data malloc install clean gpu-wheels stubs notebooks

# Where the local wheels lie (pip's find-links): the CPU build of torch is taken from there.
WHEELS := $(or $(PIP_FIND_LINKS),/opt/wheels)
# An environment with PYTHONDONTWRITEBYTECODE=1 (and uv, which does not byte-compile at install) would make every
# process parse torch, jax and transformers from source again, which slows imports severalfold (benchmarks/README.md,
# "Setup and suite"). Runs of our own venv may keep bytecode.
WITH_PYC := env -u PYTHONDONTWRITEBYTECODE
# jemalloc in place of glibc's malloc for the runs and the tests (their subprocesses inherit it): XLA's compiler and
# JAX's tracing allocate and free millions of small objects, which glibc's malloc serves more slowly (benchmarks/
# README.md, "Setup and suite"). Debian's libjemalloc2 (installed by `make malloc`); found at run time, so a machine
# without it runs on glibc's malloc. oversize_threshold:0 keeps large blocks in the ordinary arenas: by default
# jemalloc gives every block over 8 MiB (XLA's per-step buffers) back to the system at once, so each step would
# fault its memory in anew (benchmarks/step_profile.py).
JEMALLOC = $(shell ldconfig -p 2>/dev/null | awk '/libjemalloc\.so\.2 /{print $$NF; exit}')
RUN = $(WITH_PYC) $(if $(JEMALLOC),LD_PRELOAD=$(JEMALLOC)$(if $(LD_PRELOAD),:$(LD_PRELOAD)) \
  MALLOC_CONF=$(or $(MALLOC_CONF),oversize_threshold:0))

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet uv==0.13.9
	# torch exact, from the local wheels: the CPU build; a looser spec would pull a multi-GB CUDA build.
	# uv resolves and unpacks in parallel, far faster than pip (benchmarks/README.md, "Setup and suite").
	$(VENV)/bin/uv pip install --python $(PY) --quiet $(if $(wildcard $(WHEELS)),--find-links $(WHEELS)) \
	  torch==2.13.0 -e '.[test]'
	# Two single-threaded jobs side by side: byte-compile only what every run and test process imports
	# (--compile-bytecode would compile every installed file), and build the oneDNN convolutions for XLA:CPU
	# (conv_impl: onednn) against torch's and jaxlib's headers (a failed build only makes conv_impl=onednn unavailable)
	$(WITH_PYC) $(PY) -c "import jaxcomposer.cli, torch_bridge, torch.export, torchmetrics, matplotlib.pyplot, \
	  tensorboardX, pytest, xdist, ipykernel.kernelapp, nbclient, jupytext, mlflow.tracking, wandb, \
	  transformers.models.gpt2.modeling_gpt2, transformers.models.bert.modeling_bert" & pyc=$$!; \
	{ command -v g++ >/dev/null 2>&1 || command -v c++ >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq g++; \
	  else echo "no C++ compiler: conv_impl=onednn will be unavailable (install g++)"; fi; }; } ; \
	$(WITH_PYC) $(PY) -c "import torch_bridge.kernels as k; print('oneDNN convolution kernel:', k.build())" || \
	  echo "the oneDNN kernel did not build: conv_impl=onednn will be unavailable"; \
	wait $$pyc
	touch $(STAMP)

install: $(STAMP)

# Fashion-MNIST comes from Debian's dataset-fashion-mnist; without apt (or root) the runs fall back to digits.
data:
	@if [ ! -f $(FMNIST) ]; then \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) || echo "apt-get failed: runs will use digits"; \
	  else echo "Fashion-MNIST missing and apt-get unusable: runs will fall back to scikit-learn digits"; fi; \
	fi

malloc:
	@if [ -z "$(JEMALLOC)" ]; then \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    apt-get install -y -qq libjemalloc2 >/dev/null 2>&1 || \
	    (apt-get update -qq && apt-get install -y -qq libjemalloc2) || echo "apt-get failed: runs use glibc's malloc"; \
	  else echo "libjemalloc2 missing and apt-get unusable: runs use glibc's malloc"; fi; \
	fi

demo: $(STAMP) data malloc
	$(RUN) $(VENV)/bin/jaxcomposer fit configs/quickstart.yaml

# One worker per core: more workers than cores are slower on CPU-bound files, as the subprocess tests keep the cores
# busy themselves (benchmarks/README.md, "Setup and suite"); slow tests run first (tests/conftest.py); --dist
# loadgroup keeps files with module-level caches on one worker.
WORKERS ?= 2
test: $(STAMP) data malloc
	$(RUN) $(VENV)/bin/pytest -n $(WORKERS) --dist loadgroup -q --durations=40

# The notebooks, run in full in a fresh kernel and written back with their outputs (notebooks/execute.py)
notebooks: $(STAMP) data malloc
	$(RUN) $(PY) notebooks/execute.py

# After adding a method: the .pyi stubs that list jaxcomposer.algorithms' and jaxcomposer.functional's names for type
# checkers and IDEs, written from the method registry (tests/test_public_api.py fails while they are stale)
stubs: $(STAMP)
	$(RUN) $(PY) -m jaxcomposer.stubs

test-fast: $(STAMP) data malloc
	$(RUN) $(VENV)/bin/pytest -n $(WORKERS) --dist loadgroup -q -m "not slow"

clean:
	rm -rf $(VENV) runs .pytest_cache

# What benchmarks/gpu_suite.py needs on the lent GPU machine beyond its image (Python 3.12): wheels to carry in .whl/
GPU_WHEELS := pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
# And in .whl/pinned, flax, optax and orbax at the project's pinned versions: benchmarks/gpu_device_run.sh falls back
# to them when the lent machine's newer ones fail its CPU check.
GPU_PINNED_WHEELS := flax==0.12.8 optax==0.2.8 orbax-checkpoint==0.12.8
gpu-wheels:
	python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  $(foreach p,manylinux_2_28 manylinux_2_24 manylinux_2_17 manylinux2014,--platform $(p)_x86_64) -d .whl $(GPU_WHEELS)
	python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  -d .whl/pinned $(GPU_PINNED_WHEELS)
	@grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
