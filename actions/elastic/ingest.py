"""Keeps a growing stream of chunks in memory that grows with it (see scad.yaml)."""
import hashlib

import numpy

from scad.state import open_state

HEADER = 4096  # room for a slot's length, page-aligned chunks


def main(args, action):
    chunks, chunk_bytes = int(args.get("chunks", 64)), int(args.get("chunk_kib", 1024)) * 1024
    width = chunk_bytes + HEADER
    st = open_state(action, args)
    capacity, grown = 4, 0
    st.grow("stream", "template", capacity * width)
    rng = numpy.random.default_rng(17)
    for c in range(chunks):
        if c == capacity:  # the data outgrew its memory: twice the room (what it holds stays where it is)
            capacity *= 2
            st.grow("stream", "template", capacity * width)
            grown += 1
        st.put("stream", c, rng.integers(0, 1 << 20, chunk_bytes // 8, dtype=numpy.int64), slots=capacity)
    digest, total = hashlib.sha256(), 0
    for c in range(chunks):
        values = st.get("stream", c, numpy.int64, slots=capacity)
        total += int(values.sum())
        digest.update(values.tobytes())
    st.release("stream")
    return {"chunks": chunks, "bytes": chunks * chunk_bytes, "grown": grown, "sum": total,
            "digest": digest.hexdigest(), "storage": st.kind, "state": st.counters()}
