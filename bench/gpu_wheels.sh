#!/usr/bin/env bash
# The wheels bench/gpu_check.py and bench/gpu_table.py need on the GPU machine, whose image (Python 3.12, torch,
# transformers, numpy, PyYAML, requests, tqdm, rich, safetensors) has no pydantic and no gguf (gpu_table reads
# SmolLM2's or Gemma 3's GGUF there) and reaches no registry: downloaded here into .whl/ (.gitignore'd),
# carried there with the checkout, and installed there with
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
# pydantic-core is a compiled wheel (about 2 MB), the others pure Python; the versions this project is tested with
# (make install; gguf: the `gguf` extra's, whose dependencies the image has). typing-extensions too: pydantic needs
# >= 4.16.0, and the image's is of unknown version (on PYTHONPATH, this one shadows it; it is backward compatible).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 gguf==0.19.0
ls -l .whl
