# Two commands do all set-up on a fresh machine:
#   make lab   install, then open JupyterLab on the course
#   make test  install, then run every test
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Installed only when the environment has no torch yet; an existing (CUDA) torch is kept.
TORCH_SPEC ?= torch==2.13.0
# SYSTEM_SITE=1 builds the venv on top of the base Python's packages (e.g. its CUDA torch).
SYSTEM_SITE ?=
LAB_PORT ?= 8888
# Test processes side by side (pytest-xdist): both cores of the course's machines; 0 runs in one.
TEST_JOBS ?= 2
# The GPU machine's Triton, beside ours, only to compile the kernels for sm_90 without a GPU (tests).
TRITON_GPU_VERSION ?= 3.6.0
TRITON_GPU_DIR := $(VENV)/triton-$(TRITON_GPU_VERSION)
# Triton's cache for that compile test, kept between runs (keyed by the kernels' source and Triton)
TRITON_COMPILE_CACHE ?= $(VENV)/.cache/triton-compile
FIRST_LAB := $(firstword $(sort $(wildcard labs/00_*.ipynb)))
STAMP := $(VENV)/.kvlab-installed
TEST_STAMP := $(VENV)/.kvlab-test-installed
KERNEL_SPEC := $(VENV)/share/jupyter/kernels/kvlab/kernel.json
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json
PIP := $(PY) -m pip install --disable-pip-version-check --progress-bar on

.PHONY: install install-test lab test test-notebooks labs lint format clean browser triton-gpu wheel

install: $(STAMP) $(KERNEL_SPEC) $(LAB_OVERRIDES)

# What a learner needs, step by step with sizes, so a first install is never a silent wait.
$(STAMP): pyproject.toml
	@test -x $(PY) || { echo "kvlab: creating the environment $(VENV)"; \
		$(PYTHON) -m venv $(if $(SYSTEM_SITE),--system-site-packages) $(VENV); }
	@if $(PY) -c "import torch" 2>/dev/null; then \
		echo "kvlab: [1/3] keeping the installed torch $$($(PY) -c 'import torch; print(torch.__version__)')"; \
	else \
		echo "kvlab: [1/3] installing $(TORCH_SPEC), the largest piece (~200 MB to fetch for a CPU build, a few GB for a CUDA one)"; \
		$(PIP) "$(TORCH_SPEC)"; \
	fi
	@echo "kvlab: [2/3] installing kvlab with Triton (~1 GB installed), JupyterLab, widgets, matplotlib"
	$(PIP) -e .
	@touch $@
	@echo "kvlab: installed into $(VENV) ($$(du -sh $(VENV) 2>/dev/null | cut -f1))"

# Re-registered whenever the launcher changes, so an existing checkout never keeps an old kernelspec.
$(KERNEL_SPEC): kvlab/course/jupyter_kernel.py | $(STAMP)
	@echo "kvlab: [3/3] registering the 'kvlab (Python 3)' Jupyter kernel"
	$(VENV)/bin/kvlab kernel

# JupyterLab's defaults for this environment: no news toast over the outputs, no update check.
$(LAB_OVERRIDES): kvlab/course/lab_settings.py | $(STAMP)
	@$(PY) -m kvlab.course.lab_settings

# The test tools (pytest, hypothesis, nbval, ruff, Playwright) come with `make test` only.
install-test: $(TEST_STAMP)

$(TEST_STAMP): $(STAMP) | $(KERNEL_SPEC) $(LAB_OVERRIDES)
	@echo "kvlab: installing the test tools: pytest, hypothesis, nbval, ruff, Playwright (~200 MB)"
	$(PIP) -q -e ".[test]"
	@touch $@

# Opens a browser only where there is a display; on a headless machine the URL (with its token) is printed.
lab: install
	$(VENV)/bin/jupyter lab --ip=127.0.0.1 --port=$(LAB_PORT) --ServerApp.root_dir=. \
		--LabApp.default_url=/lab/tree/$(FIRST_LAB) \
		$(if $(DISPLAY)$(WAYLAND_DISPLAY)$(filter Darwin,$(shell uname -s)),,--no-browser) \
		$(if $(filter 0,$(shell id -u)),--allow-root)

# The widget's browser test needs Debian's chromium; install it where we can (root + apt-get).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "kvlab: installing Debian's chromium for the browser tests"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
		else \
			echo "kvlab: chromium is missing and cannot be installed here (needs root and apt-get): browser tests will be skipped"; \
		fi; }

triton-gpu: $(TRITON_GPU_DIR)/.installed

# Best effort: without it (offline, say) the compile test uses our Triton only and says so.
$(TRITON_GPU_DIR)/.installed: | install-test
	@$(PY) -m pip install --disable-pip-version-check -q --no-deps --target $(TRITON_GPU_DIR) \
		"triton==$(TRITON_GPU_VERSION)" && touch $@ \
		|| echo "kvlab: could not install triton $(TRITON_GPU_VERSION) beside ours: its compile test will be skipped"

# Two runs: the package's tests, then every solution notebook through the registered `kvlab`
# kernel exactly as JupyterLab runs it. Nothing here sets TRITON_INTERPRET: the kernel decides
# (the first run imports kvlab, which sets it in that process, so notebooks get their own run).
# Each run uses TEST_JOBS processes: test files (single tests where tests/conftest.py says so) and
# notebooks are handed to whichever is free, the longest first.
test: install-test browser triton-gpu
	$(VENV)/bin/ruff check kvlab tests solutions/conftest.py
	$(VENV)/bin/ruff format --check kvlab tests solutions/conftest.py
	KVLAB_TRITON_GPU_DIR=$(TRITON_GPU_DIR) KVLAB_TRITON_COMPILE_CACHE=$(TRITON_COMPILE_CACHE) \
		$(PY) -m pytest tests -p no:cacheprovider -p no:nbval \
		-n $(TEST_JOBS) --dist loadscope --durations=15 $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-notebooks

test-notebooks: install-test $(KERNEL_SPEC)
	$(PY) -m pytest solutions --nbval-lax --nbval-kernel-name kvlab --nbval-cell-timeout=90 \
		--nbval-kernel-startup-timeout=120 -p no:cacheprovider -n $(TEST_JOBS) --dist loadfile \
		$(NBVAL_ARGS)

labs: install
	$(VENV)/bin/kvlab labs

# The whole course in one file: dist/kvlab-<version>-py3-none-any.whl (`pip install` it, then
# `kvlab start`). Built offline with the environment's setuptools when it is recent enough.
wheel: install
	@rm -rf build dist/kvlab-*.whl
	$(PY) -m pip wheel --disable-pip-version-check -q --no-deps -w dist \
		$$($(PY) -c "import setuptools as s; print('--no-build-isolation' * (int(s.__version__.split('.')[0]) >= 68))" 2>/dev/null) .
	@ls -lh dist/kvlab-*.whl

lint: install-test
	$(VENV)/bin/ruff check kvlab tests solutions/conftest.py

format: install-test
	$(VENV)/bin/ruff format kvlab tests solutions/conftest.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis build dist
