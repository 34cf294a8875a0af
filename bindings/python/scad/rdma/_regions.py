"""The owner's registration cache: which of its memory is served, as regions (libd elements).

A buffer is a slice of a region. A request for memory inside a live region reuses it; anything
else registers a new region of exactly the memory asked for. A region lives while one of its
buffers does, and holds the objects that own its memory, so that memory cannot be freed and its
addresses reused under it. When its last buffer is dropped it is withdrawn and forgotten: an
address range used again later - at another size, or the same - is a miss, registered afresh,
never a stale entry. Overlapping regions may coexist (a larger request over a smaller live one):
each stays exactly the memory it was registered for.
"""
import bisect
from typing import Any, Dict, List, Optional


class Region:
    def __init__(self, element: str, start: int, size: int) -> None:
        self.element = element
        self.start = start
        self.size = size
        self.holders: Dict[str, Any] = {}  # grant id -> the object owning that buffer's memory

    def contains(self, addr: int, size: int) -> bool:
        return self.start <= addr and addr + size <= self.start + self.size

    def __repr__(self) -> str:
        return f"Region({self.element}, {self.start:#x}, {self.size}, buffers={len(self.holders)})"


class RegionCache:
    def __init__(self) -> None:
        self._starts: List[int] = []   # sorted, parallel to _regions
        self._regions: List[Region] = []
        self._largest = 0              # the largest size ever added: bounds how far back to look
        self._by_grant: Dict[str, Region] = {}

    def find(self, addr: int, size: int) -> Optional[Region]:
        """A live region holding all of [addr, addr+size), the smallest such, or None."""
        best = None
        # Only regions starting at or before addr, and no further back than the largest region
        # reaches, can hold it: a thousand regions cost a few steps, not a thousand.
        lowest = addr + size - self._largest
        for i in range(bisect.bisect_right(self._starts, addr) - 1, -1, -1):
            if self._starts[i] < lowest:
                break
            r = self._regions[i]
            if r.contains(addr, size) and (best is None or r.size < best.size):
                best = r
        return best

    def add(self, region: Region) -> None:
        i = bisect.bisect_right(self._starts, region.start)
        self._starts.insert(i, region.start)
        self._regions.insert(i, region)
        self._largest = max(self._largest, region.size)

    def remove(self, region: Region) -> None:
        i = bisect.bisect_left(self._starts, region.start)
        while self._regions[i] is not region:
            i += 1
        del self._starts[i]
        del self._regions[i]
        for grant in list(region.holders):
            self._by_grant.pop(grant, None)

    def hold(self, region: Region, grant: str, owner: Any) -> None:
        region.holders[grant] = owner
        self._by_grant[grant] = region

    def release(self, grant: str) -> Optional[Region]:
        """Forgets the buffer with this grant; its region, or None if no such buffer."""
        region = self._by_grant.pop(grant, None)
        if region is not None:
            del region.holders[grant]
        return region

    def regions(self) -> List[Region]:
        return list(self._regions)
