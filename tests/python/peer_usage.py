"""What a test peer (connect_peer.py, rdma_peer.py, tensor_peer.py) reports of its own resources,
for the tests that run a thousand operations and look for growth."""
import ctypes
import gc
import os


def no_huge_pages():
    """Transparent huge pages make resident memory jump by 2 MiB at a time, which a leak test
    would read as growth: the calling process does without them (PR_SET_THP_DISABLE)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(41, 1, 0, 0, 0)


def usage():
    """Open file descriptors, resident memory (KiB) and Python objects after a collection."""
    fds = len(os.listdir("/proc/self/fd"))
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    gc.collect()
    return {"fds": fds, "rss_kib": rss, "objects": len(gc.get_objects())}
