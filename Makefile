# `make test` and `make demo` work on a fresh clone: each creates .venv and installs what it needs.
# CPU torch is pinned by default (an unpinned torch pulls a multi-GB CUDA build);
# GPU users override it, e.g. `make test TORCH=torch`.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(subst /,_,$(subst =,_,$(subst >,_,$(subst <,_,$(TORCH)))))

.PHONY: install test demo lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[test,hf]"
	rm -f $(VENV)/.installed-*
	touch $@

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

DEMO_DIR ?= runs/demo

# The main job on the CPU with an embedded Ray and the shipped reference model: search, export, compare.
demo: $(STAMP)
	rm -rf $(DEMO_DIR)
	$(BIN)/longrope search configs/demo.yaml --set output_dir=$(DEMO_DIR)
	$(BIN)/longrope status $(DEMO_DIR)
	$(BIN)/longrope export $(DEMO_DIR) -o $(DEMO_DIR)/factors.json
	$(BIN)/longrope compare configs/demo.yaml --set output_dir=$(DEMO_DIR) --factors $(DEMO_DIR)/factors.json -o $(DEMO_DIR)/compare
	@echo "demo: factors in $(DEMO_DIR)/factors.json; table and plots in $(DEMO_DIR)/compare/"
	@echo "demo: the CLI is $(BIN)/longrope (or run 'source $(BIN)/activate' once, then longrope), e.g. $(BIN)/longrope status $(DEMO_DIR)"

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build dist *.egg-info
