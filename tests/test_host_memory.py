"""glibc's heap keeps freed megabyte tensors resident once its dynamic mmap threshold has risen; with
`return_freed_memory` they are unmapped when freed. Each case runs in a process of its own (the setting is per
process) and reads its resident memory from /proc/self/statm, the figure the machine's OOM killer counts."""

from __future__ import annotations

import platform
import subprocess
import sys

from longrope.workers.host_memory import return_freed_memory

# One 16 MiB tensor freed (glibc's threshold rises to it), then 64 tensors of 2 MiB, each followed by a 64 KiB tensor
# that is kept, and then the 2 MiB ones freed: the pattern of a checkpointed backward, which frees a layer's
# activations while smaller tensors allocated after them stay. Each freed 2 MiB chunk lies between two kept ones, so
# glibc can neither merge it into the heap's top nor hand it back; nothing is freed before the kept tensors are all
# placed, so where they land does not depend on the allocator's choice among holes. Prints the growth of resident
# memory in MiB.
FRAGMENTING = """
import sys
import torch
from longrope.workers.host_memory import return_freed_memory
if sys.argv[1] == "set":
    assert return_freed_memory()
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
start = resident()
first = torch.ones(4 << 20)
del first
large, kept = [], []
for i in range(64):
    large.append(torch.ones((2 << 20) // 4))
    kept.append(torch.ones(16384))
del large
print((resident() - start) / 2**20)
"""
KEPT_MIB = 64 * 16384 * 4 / 2**20  # 4 MiB held at the end


def resident_growth(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", FRAGMENTING, mode], capture_output=True, text=True, check=True)
    return float(done.stdout.strip())


def test_freed_megabyte_tensors_leave_the_process():
    if platform.libc_ver()[0] != "glibc":
        assert return_freed_memory() is False  # no such threshold to set: nothing is changed
        return
    assert resident_growth("default") > 8 * KEPT_MIB  # the holes stay resident: what the setting is for
    assert resident_growth("set") < KEPT_MIB + 4  # only what is kept, and the heap's small change
