"""Run as a script by tests/test_sharded_load.py, in a process of its own: the peak of this process's anonymous
memory (RssAnon: what a copy of the weights takes; not the safetensors files' mapped pages, which are the kernel's page
cache and reclaimable) while the worker's loader (`workers.models.sharded_load`, with a device map) loads a model
and every parameter is read, above what it held before; then the same for a loader that holds a whole state dict at
once, the route a device map avoids.

argv: MODEL_DIR TINY_MODEL_DIR DTYPE. Prints one JSON object: the tiny model's peak (the loader's own cost, weights
aside), the model's peak, its weights' bytes, and the whole-state-dict route's peak."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import torch

from longrope.workers.model_build import model_config
from longrope.workers.models import sharded_load


def rss_anon() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


class AnonPeak:
    """The largest RssAnon seen while the block runs, sampled every half millisecond (the kernel keeps a peak of
    the whole RSS, VmHWM, but not of its anonymous part); a whole copy lasts the load, far longer than a sample."""

    def __init__(self):
        self.peak, self.done = rss_anon(), False
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.done:
            self.peak = max(self.peak, rss_anon())
            time.sleep(0.0005)

    def __enter__(self) -> AnonPeak:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done = True
        self.thread.join()
        self.peak = max(self.peak, rss_anon())


def worker_load(directory: Path, dtype: torch.dtype):
    """(model, anonymous peak above the start) of the worker's loader with every parameter read after."""
    config = model_config(directory, trust_remote_code=False, config_overrides=None)
    before = rss_anon()
    with AnonPeak() as anon:
        model = sharded_load(directory, config, device_map={"": "cpu"}, dtype=dtype, attention="sdpa",
                             trust_remote_code=False)  # fmt: skip
        with torch.no_grad():
            sum(float(param.sum()) for param in model.parameters())
    return model, anon.peak - before


def whole_state_dict(directory: Path, dtype: torch.dtype) -> int:
    """The anonymous peak of holding every shard's tensors at once, then converting them: a whole host copy."""
    from safetensors.torch import load_file

    before = rss_anon()
    with AnonPeak() as anon:
        state = {}
        for shard in sorted(directory.glob("*.safetensors")):
            state.update({name: tensor.clone() for name, tensor in load_file(shard).items()})
        converted = {name: tensor.to(dtype, copy=True) for name, tensor in state.items()}  # the model's own
        del state, converted
    return anon.peak - before


def main() -> None:
    model_dir, tiny_dir, dtype = Path(sys.argv[1]), Path(sys.argv[2]), getattr(torch, sys.argv[3])
    worker_load(tiny_dir, dtype)  # imports and first-call set-up, out of the measurements
    _, tiny = worker_load(tiny_dir, dtype)
    model, peak = worker_load(model_dir, dtype)
    weights = sum(param.numel() * param.element_size() for param in model.parameters())
    del model
    print(json.dumps({"tiny": tiny, "peak": peak, "weights": weights, "whole": whole_state_dict(model_dir, dtype)}))


if __name__ == "__main__":
    main()
