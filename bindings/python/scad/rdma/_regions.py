"""The owner's registration cache: which of its memory is served, as regions (libd elements).

A buffer is a slice of a region. A request for memory inside a live region reuses it; anything
else registers a new region of exactly the memory asked for. A live region holds the objects that
own its memory, so that memory cannot be freed and its addresses reused under it. Overlapping
regions may coexist (a larger request over a smaller live one): each stays exactly the memory it
was registered for.

When its last buffer is dropped a region lets go of those objects. Where registering pins nothing
(a server without verbs: a region is an address range its server and cross-memory attach read
when a key allows), the owner may keep it idle for a while (`park`): a later request for exactly
that range, which is the memory living there then, takes it back without registering again, as a
loop that lends the same array each time does. An idle region answers nothing else: an address
range used again at another size, or a slice of it, is a miss, registered afresh; and with no key
on it, it opens nothing. Past `max_idle` the oldest idle region is withdrawn.
"""
import bisect
import collections
from typing import Any, Dict, List, Optional


class Region:
    def __init__(self, element: str, start: int, size: int) -> None:
        self.element = element
        self.start = start
        self.size = size
        self.holders: Dict[str, Any] = {}  # buffer's token -> the object owning that buffer's memory

    def contains(self, addr: int, size: int) -> bool:
        return self.start <= addr and addr + size <= self.start + self.size

    def __repr__(self) -> str:
        return f"Region({self.element}, {self.start:#x}, {self.size}, buffers={len(self.holders)})"


class RegionCache:
    def __init__(self, max_idle: int = 64) -> None:
        self._starts: List[int] = []   # sorted, parallel to _regions
        self._regions: List[Region] = []
        self._largest = 0              # the largest size ever added: bounds how far back to look
        self._by_token: Dict[str, Region] = {}
        # (start, size) -> the region of exactly that range: no two regions share one (a request
        # for a live or idle region's exact range takes that region), and a region of exactly
        # the range asked for is the smallest holding it, so a hit here is find's answer at once
        # (a lender's loop over one array asks for the same range every time).
        self._exact: Dict[tuple, Region] = {}
        self.max_idle = max_idle
        self._idle: "collections.OrderedDict[Region, None]" = collections.OrderedDict()  # oldest first

    def find(self, addr: int, size: int) -> Optional[Region]:
        """A live region holding all of [addr, addr+size), the smallest such; else an idle region
        of exactly that range; else None."""
        exact = self._exact.get((addr, size))
        if exact is not None:
            return exact
        best = None
        # Only regions starting at or before addr, and no further back than the largest region
        # reaches, can hold it: a thousand regions cost a few steps, not a thousand.
        lowest = addr + size - self._largest
        for i in range(bisect.bisect_right(self._starts, addr) - 1, -1, -1):
            if self._starts[i] < lowest:
                break
            r = self._regions[i]
            if (r.start != addr or r.size != size) and r in self._idle:
                continue  # idle: only its exact range takes it back
            if r.contains(addr, size) and (best is None or r.size < best.size):
                best = r
        return best

    def park(self, region: Region) -> List[Region]:
        """Keeps a region whose last buffer was dropped, idle, for a request of exactly its range;
        returns the idle regions it pushes past max_idle (oldest first), idle no more: the caller
        removes and withdraws them."""
        self._idle[region] = None
        return [self._idle.popitem(last=False)[0] for _ in range(len(self._idle) - self.max_idle)]

    def idle(self) -> List[Region]:
        return list(self._idle)

    def add(self, region: Region) -> None:
        i = bisect.bisect_right(self._starts, region.start)
        self._starts.insert(i, region.start)
        self._regions.insert(i, region)
        self._largest = max(self._largest, region.size)
        self._exact.setdefault((region.start, region.size), region)

    def remove(self, region: Region) -> None:
        self._idle.pop(region, None)
        i = bisect.bisect_left(self._starts, region.start)
        while self._regions[i] is not region:
            i += 1
        del self._starts[i]
        del self._regions[i]
        if self._exact.get((region.start, region.size)) is region:
            del self._exact[(region.start, region.size)]
        for token in list(region.holders):
            self._by_token.pop(token, None)

    def hold(self, region: Region, token: str, owner: Any) -> None:
        """A buffer (named by its token) on region, whose memory `owner` keeps alive."""
        if not region.holders:
            self._idle.pop(region, None)  # taken back from idle (or new)
        region.holders[token] = owner
        self._by_token[token] = region

    def holds(self, region: Region, token: str) -> bool:
        """Whether the buffer with this token is on region still (not dropped)."""
        return self._by_token.get(token) is region

    def release(self, token: str) -> Optional[Region]:
        """Forgets the buffer with this token; its region, or None if no such buffer."""
        region = self._by_token.pop(token, None)
        if region is not None:
            del region.holders[token]
        return region

    def regions(self) -> List[Region]:
        return list(self._regions)
