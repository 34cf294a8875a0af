"""Writes n float64 values (i % 1000 for i in 0..n-1) into the memory element `data`."""
from array import array

CHUNK = 1 << 17  # values per write


def main(args, action):
    n = int(args.get("n", 4_000_000))
    t = action.get_transport("data", "rdma")
    t.reg(CHUNK * 8)
    for start in range(0, n, CHUNK):
        count = min(CHUNK, n - start)
        values = array("d", (float(i % 1000) for i in range(start, start + count)))
        t.buf[:count * 8] = values.tobytes()
        t.write(count * 8, start * 8)
    return {"n": n}
