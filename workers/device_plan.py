"""How one worker's model is split over its GPUs: `workers.num_gpus_per_worker: N` (N >= 2, whole GPUs) places the
decoder's layers across the worker's N GPUs, the embedding on the first, the final norm and lm_head on the last.

The rule is the official LongRoPE release's: its search keeps 0.8 of each GPU's memory for the weights and gives each
evaluator ceil(model size / (0.8 x GPU memory)) GPUs (microsoft/LongRoPE evolution/search.py, `mem_per_device` and
`devices_per_model`), whose model is then loaded with `device_map="auto"` over them (evolution/evaluate.py). The
other 0.2 holds a forward's activations: the keys and values of one layer, the MLP's chunk, the loss's logits.
Here the 0.8 is handed to transformers as `max_memory` per GPU, so accelerate's device map never fills a GPU past it
(transformers modeling_utils.py `_get_device_map` -> accelerate utils/modeling.py `get_balanced_memory` and
`infer_auto_device_map`).

Pure arithmetic and a pydantic model, no torch: `longrope estimate` prices the same plan without loading anything.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, computed_field

# The share of each GPU's memory the weights may take (microsoft/LongRoPE evolution/search.py: `* 0.8`)
WEIGHT_SHARE = 0.8


class DevicePlan(BaseModel):
    """The split of one worker's model over its `gpus` GPUs of `gpu_memory` bytes each."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: int = Field(ge=1)
    gpu_memory: float = Field(gt=0)  # bytes of each GPU (the smallest, where they differ)
    weights: float = Field(ge=0)  # bytes of every parameter at the worker's dtype
    layers: int = Field(ge=1)  # decoder layers
    weight_share: float = Field(default=WEIGHT_SHARE, gt=0, le=1)

    @computed_field
    @property
    def gpus_needed(self) -> int:
        """ceil(weights / (share x GPU memory)): the GPUs the release gives an evaluator for this model."""
        return max(1, math.ceil(self.weights / (self.weight_share * self.gpu_memory)))

    @computed_field
    @property
    def max_memory(self) -> dict[int, int]:
        """transformers' `max_memory` per GPU index: the share of each GPU the weights may take."""
        return {index: int(self.weight_share * self.gpu_memory) for index in range(self.gpus)}

    @computed_field
    @property
    def fits(self) -> bool:
        """The weights within the worker's GPUs at the share (the activations' room is the rest)."""
        return self.gpus_needed <= self.gpus

    @computed_field
    @property
    def layers_per_device(self) -> tuple[int, ...]:
        """Decoder layers on each GPU, as accelerate's balanced map aims for them: an even split (each GPU's budget
        is the weights / N plus a layer: accelerate utils/modeling.py `get_balanced_memory`), the first GPUs taking
        the remainder. The map accelerate builds moves a layer or two between GPUs (the first keeps room for its
        largest module, the embedding sits on the first and lm_head on the last: `infer_auto_device_map`), so this
        is the plan's expectation, not the map; the loaded model's `hf_device_map` is the map."""
        each, extra = divmod(self.layers, self.gpus)
        return tuple(each + (index < extra) for index in range(self.gpus))

    @property
    def first_device(self) -> int:
        """Where the embedding is, and where the scorer puts the input ids."""
        return 0

    @property
    def last_device(self) -> int:
        """Where the final norm and lm_head are, and where the loss's targets and masks go."""
        return self.gpus - 1

    @property
    def weights_per_gpu(self) -> float:
        """Each GPU's share of the weights, the split taken as even."""
        return self.weights / self.gpus

    def problem(self) -> str | None:
        """Why the model cannot be spread over these GPUs, or None."""
        if self.fits:
            return None
        return (
            f"workers.num_gpus_per_worker = {self.gpus}: the weights ({self.weights / 2**30:.3g} GiB) need "
            f"{self.gpus_needed} GPUs of {self.gpu_memory / 2**30:.3g} GiB at {self.weight_share:g} of each"
        )


def plan_devices(weights: float, layers: int, gpus: int, gpu_memory: float) -> DevicePlan:
    """The plan for `weights` bytes over `layers` decoder layers on `gpus` GPUs of `gpu_memory` bytes."""
    return DevicePlan(gpus=gpus, gpu_memory=gpu_memory, weights=weights, layers=layers)


def spans_gpus(num_gpus_per_worker: float) -> bool:
    """Whether a worker of this many GPUs spreads its model over them (two or more); fewer keeps one device."""
    return num_gpus_per_worker >= 2
