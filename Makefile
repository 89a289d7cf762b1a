# make demo: set up .venv and train the quickstart recipe.  make test: set up .venv and run the test suite.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
FMNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz

.PHONY: demo test test-fast data install clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	# torch first and exact: the CPU wheel on this disk; a looser spec would pull a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	# the rest through uv, which resolves and unpacks in parallel: ~15 s where pip takes ~2 min on 2 cores.
	# uv keeps the torch above (every requirement accepts 2.13.0).
	$(PY) -m pip install --quiet uv==0.13.9
	$(VENV)/bin/uv pip install --python $(PY) --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# Fashion-MNIST comes from Debian's dataset-fashion-mnist; without apt (or root) the runs fall back to digits.
data:
	@if [ ! -f $(FMNIST) ]; then \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) || echo "apt-get failed: runs will use digits"; \
	  else echo "Fashion-MNIST missing and apt-get unusable: runs will fall back to scikit-learn digits"; fi; \
	fi

demo: $(STAMP) data
	$(VENV)/bin/jaxcomposer fit configs/quickstart.yaml

# 3 workers on 2 cores: subprocess tests and checkpoint I/O leave a core idle at times; slow tests run first
# (tests/conftest.py); --dist loadgroup keeps files with module-level caches on one worker.
test: $(STAMP) data
	$(VENV)/bin/pytest -n 3 --dist loadgroup -q

test-fast: $(STAMP) data
	$(VENV)/bin/pytest -n 3 --dist loadgroup -q -m "not slow"

clean:
	rm -rf $(VENV) runs .pytest_cache
