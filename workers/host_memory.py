"""Freed host tensors go back to the operating system at once, so a long CPU gradient pass peaks at what it holds.

torch's CPU allocator takes each tensor's memory from the C library's malloc. glibc serves a request of at least
`M_MMAP_THRESHOLD` bytes with its own mmap, unmapped when freed, and anything smaller from the heap, which returns
freed memory only from its top. The threshold starts at 128 KiB and is dynamic: each time an mmapped chunk is
freed it rises to that chunk's size, up to 32 MiB on 64-bit systems (glibc malloc/malloc.c, `mp_.mmap_threshold`
and DEFAULT_MMAP_THRESHOLD_MAX; mallopt(3)). So after the first layer's activations are freed, the next layers'
megabyte-sized tensors come from the heap, and the holes the backward leaves there stay resident while smaller
tensors live above them. A checkpointed backward frees and reallocates a layer's activations once per layer, which
is that pattern at its worst: a Gemma 3 270M gradient pass over 64k tokens on the 2-core CPU reached the 24 GiB
machine's limit and was killed, while the tensors it held at any time sum to a third of that.

Setting the threshold once (`mallopt(M_MMAP_THRESHOLD, 1 MiB)`, which also turns the dynamic rise off) sends every
tensor of a megabyte or more to mmap, returned on free, and leaves the small ones on the heap. bench/host_memory.py
measures the same gradient pass both ways, side by side: at 8k tokens on Gemma 3 270M the peak fell to 0.72 of the
default's with the same NLL and gradient, and the pass took 1.18 times as long (fresh pages are mapped and zeroed
for each large tensor). So the scorer sets it on its first gradient pass, where the holes cost most, and a process
that only runs forwards keeps glibc's default. The setting is per process and stays for the process's life. Other C
libraries (musl, macOS) have no such threshold: nothing is changed there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
MMAP_THRESHOLD_BYTES = 1 << 20


def return_freed_memory(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Have glibc mmap every allocation of `threshold` bytes or more, returned to the system when freed; False
    where the C library is not glibc (the call would mean nothing there) or refuses the value."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(threshold)))
