"""A device string (`model.device`, `verify --device`) checked without torch, so that `validate --offline` and the
config loader refuse `tpu9` in one line instead of torch raising "Invalid device string" inside a worker."""

from __future__ import annotations

import re

# What torch.device parses, in the order its error message lists them (c10/core/Device.cpp, `parse_type`)
TORCH_DEVICE_TYPES = (
    "cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve", "fpga", "maia", "xla", "lazy",
    "vulkan", "mps", "meta", "hpu", "mtia", "privateuseone",
)  # fmt: skip
# c10::DeviceIndex is int8_t (c10/core/Device.h): torch.device("cuda:128") silently becomes cuda:-128
MAX_DEVICE_INDEX = 127
# torch's grammar: TYPE or TYPE:INDEX, the index without a sign or a leading zero (c10/core/Device.cpp)
DEVICE_STRING = re.compile(r"(?P<type>[a-z]+)(?::(?P<index>0|[1-9][0-9]*))?")
AUTO = "auto"  # ours: CUDA when torch can use it, else the CPU (workers/models.py, resolve_device)


def device_problem(device: str) -> str | None:
    """Why torch would refuse (or silently misread) `device`, or None when it is "auto" or one torch parses."""
    if device == AUTO:
        return None
    match = DEVICE_STRING.fullmatch(device)
    if match is None or match["type"] not in TORCH_DEVICE_TYPES:
        types = ", ".join(TORCH_DEVICE_TYPES)
        return f"not a device torch knows (expected auto, or TYPE[:INDEX] with TYPE one of {types})"
    if match["index"] is not None and int(match["index"]) > MAX_DEVICE_INDEX:
        return f"device index {match['index']} is past torch's largest ({MAX_DEVICE_INDEX})"
    return None
