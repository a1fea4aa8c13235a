# Two entry points, both from nothing: `make demo` (the main job) and `make test` (the suite).
# TORCH pins the CPU wheel for this set-up only; the package itself accepts any torch >= 2.5
# (on a GPU machine: make demo TORCH=torch). numpy<2: the Python backend of the CPU-capable
# tritonserver in nvidia-pytriton (installed --no-deps: its metadata pins old packages) needs it.
# speculators (vllm-project's drafter library: the tests build and run drafters with it) is installed --no-deps
# too: its metadata asks for numpy>=2 (see above), torchvision/torchaudio (CUDA wheels that would replace the CPU
# torch) and transformers<=5.19 (the suite runs 5.23, which its DFlash classes work with: tested). What its import
# needs besides is in the test extra.
# aiconfigurator-core (dflash-bench plan) is --no-deps too: its metadata asks numpy>=2.1; it runs with 1.26, same estimates.
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python

.PHONY: demo test test-fast clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" "numpy<2"
	$(PY) -m pip install -q -e ".[test]" "numpy<2"
	$(PY) -m pip install -q --no-deps nvidia-pytriton==0.7.0 speculators==0.9.0 hs-connectors==0.9.0 \
		aiconfigurator-core==0.12.0
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/dflash-demo

# two workers, one core each, a file's tests on one worker (tests/README.md: why)
test: $(VENV)/.installed
	$(PY) -m pytest -q -n 2 --dist loadfile

# the edit loop: no test marked slow (over about 10 s) and none that starts tritonserver (tests/README.md)
test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -m "not slow and not serve"

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
