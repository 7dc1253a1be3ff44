"""Freed heap memory: handed back to the operating system (``release_freed_memory``), or kept for the next tensors
(``keep_freed_memory``, what the online trainers do on the CPU)."""

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import torch
    from rlhfkit.accel.online import release_freed_memory

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


REUSE = textwrap.dedent(
    """
    import ctypes, sys
    import torch
    from rlhfkit.accel.online import keep_freed_memory

    kept = keep_freed_memory() if sys.argv[1] == "keep" else False

    class MallInfo2(ctypes.Structure):  # glibc's mallinfo2: sizes in bytes
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"
        )]

    libc = ctypes.CDLL("libc.so.6")
    if not hasattr(libc, "mallinfo2"):
        print(int(kept), -1, -1)
        raise SystemExit
    libc.mallinfo2.restype = MallInfo2
    before = libc.mallinfo2()
    block = torch.ones(24 * 2**18)  # 24 MB
    mapped = libc.mallinfo2().hblkhd - before.hblkhd  # in mappings of their own
    del block
    heap = libc.mallinfo2().arena - before.arena  # the heap's growth, after the block is freed
    print(int(kept), mapped >> 20, heap >> 20)
    """
)


def _heap_use(mode: str, **env) -> tuple[bool, int, int]:
    import os

    run_env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "RLHFKIT_ACCEL")} | env
    out = subprocess.run(
        [sys.executable, "-c", REUSE, mode], capture_output=True, text=True, check=True, env=run_env
    ).stdout
    kept, mapped, heap = map(int, out.split())
    return bool(kept), mapped, heap


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux-only")
def test_kept_heap_memory_holds_large_tensors_and_keeps_them_after_free(monkeypatch):
    from rlhfkit.accel.online import keep_freed_memory

    # the user's own malloc settings, or RLHFKIT_ACCEL=0, are left alone (checked here: nothing is set then)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=8")
    assert keep_freed_memory() is False
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.setenv("RLHFKIT_ACCEL", "0")
    assert keep_freed_memory() is False
    kept, mapped, heap = _heap_use("keep")
    if not kept or mapped < 0:
        pytest.skip("not glibc 2.33+: nothing to tune or measure")
    _, default_mapped, default_heap = _heap_use("default")
    # by default glibc gives a 24 MB tensor a mapping of its own, unmapped (and faulted in afresh) each time;
    # kept, it comes from the heap and its pages stay there for the next tensors once it is freed
    assert default_mapped >= 24 and default_heap < 24
    assert mapped < 24 and heap >= 24
