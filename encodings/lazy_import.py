"""A module imported on first use, so that light commands (`longrope --help`, `status`, `export`) never pay for it.

`import torch` takes seconds (most of `longrope --help`'s time before this existed); the encodings only need
torch when they compute a tensor, not when they parse, validate or export a `rope_parameters` block. Names are
looked up on the real module at each access, so `isinstance(x, torch.Tensor)` and `torch.float32` behave as
with a plain import once the first access has imported it. Unlike `importlib.util.LazyLoader`, nothing is put
in `sys.modules` before the real import, so `"torch" in sys.modules` stays a true answer to "was torch loaded".
"""

from __future__ import annotations

import importlib
from types import ModuleType


class LazyModule:
    """Stands in for `import NAME`: the first attribute access imports the module and every access reads it."""

    def __init__(self, name: str):
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attribute: str):
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attribute)

    def __repr__(self) -> str:
        state = "imported" if self._module is not None else "not imported yet"
        return f"<lazy module {self._name!r}, {state}>"


torch = LazyModule("torch")
