"""Freed heap pages go back to the operating system between the online trainer's phases."""

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import torch
    from rlhfkit.training.runtime import release_freed_memory

    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    # Freeing a tensor that had its own mapping raises glibc's mmap threshold to its size, so the smaller
    # tensors after it come from the heap; a small tensor after each keeps the heap from shrinking at its top.
    big = torch.ones(16 * 2**18)  # 16 MB
    del big
    blocks, keep = [], []
    for _ in range(24):  # 24 x 8 MB, touched
        blocks.append(torch.ones(8 * 2**18))
        keep.append(torch.ones(2**14))
    before = rss_mb()
    del blocks
    freed = rss_mb()
    release_freed_memory()
    print(before, freed, rss_mb())
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim is Linux-only")
def test_release_freed_memory_lowers_the_resident_size():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout
    before, freed, after = map(float, out.split())
    if freed <= before - 96:  # an allocator (glibc version, torch build) that unmaps freed blocks itself
        pytest.skip(f"the allocator gave the freed pages back by itself ({before:.0f} -> {freed:.0f} MB): none to trim")
    assert after < freed - 96  # most of the freed 192 MB stayed resident (the heap keeps them); trimming returns them
