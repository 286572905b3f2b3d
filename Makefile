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
# The GPU machine's Triton, beside ours, only to compile the kernels for sm_90 without a GPU (tests).
TRITON_GPU_VERSION ?= 3.6.0
TRITON_GPU_DIR := $(VENV)/triton-$(TRITON_GPU_VERSION)
FIRST_LAB := $(firstword $(sort $(wildcard labs/00_*.ipynb)))
STAMP := $(VENV)/.kvlab-installed

.PHONY: install lab test labs lint format clean browser triton-gpu

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(if $(SYSTEM_SITE),--system-site-packages) $(VENV)
	@$(PY) -c "import torch" 2>/dev/null \
		&& echo "kvlab: keeping the installed torch $$($(PY) -c 'import torch; print(torch.__version__)')" \
		|| $(PY) -m pip install --disable-pip-version-check -q "$(TORCH_SPEC)"
	$(PY) -m pip install --disable-pip-version-check -q -e ".[test]"
	$(PY) -m ipykernel install --sys-prefix --name kvlab --display-name "kvlab (Python 3)" >/dev/null
	@touch $@
	@echo "kvlab: installed into $(VENV)"

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
$(TRITON_GPU_DIR)/.installed: | install
	@$(PY) -m pip install --disable-pip-version-check -q --no-deps --target $(TRITON_GPU_DIR) \
		"triton==$(TRITON_GPU_VERSION)" && touch $@ \
		|| echo "kvlab: could not install triton $(TRITON_GPU_VERSION) beside ours: its compile test will be skipped"

test: install browser triton-gpu
	$(VENV)/bin/ruff check kvlab tests
	$(VENV)/bin/ruff format --check kvlab tests
	KVLAB_TRITON_GPU_DIR=$(TRITON_GPU_DIR) TRITON_INTERPRET=1 $(VENV)/bin/python -m pytest tests solutions --nbval-lax --nbval-current-env \
		--nbval-cell-timeout=90 -p no:cacheprovider $(PYTEST_ARGS)

labs: install
	$(VENV)/bin/kvlab labs

lint: install
	$(VENV)/bin/ruff check kvlab tests

format: install
	$(VENV)/bin/ruff format kvlab tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
