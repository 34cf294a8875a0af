"""One process of the load test (test_load.py): `threads` clients, each with a transport of its
own to the same memory element, writing checksummed records into its own slot and reading them
back. Run through multiprocessing (spawn). Returns counts, sampled latencies and any mismatch."""
import random
import threading
import time
import zlib


def run(config, impl, first_client, threads, ops_per_client, slot):
    from disagg import LibdAction

    results = []
    lock = threading.Lock()

    def client(cid):
        action = LibdAction(f"load-{cid}", timeout_ms=10000)
        action.add_transport(f"mem1;{impl}")
        action.config_transport("mem1", config)
        t = action.get_transport("mem1", "rdma")
        t.reg(2 * slot)
        rng = random.Random(cid)
        base = cid * slot
        lat = []
        bad = 0
        for seq in range(ops_per_client // 2):
            size = rng.randrange(16, slot - 8)
            body = bytes([(cid + seq + i) & 0xFF for i in range(0, size, 97)]) * 97
            body = body[:size]
            record = zlib.crc32(body).to_bytes(4, "little") + size.to_bytes(4, "little") + body
            t.buf[0:len(record)] = record
            t0 = time.perf_counter_ns()
            t.write(len(record), base, 0)
            t.read(len(record), base, slot)
            lat.append(time.perf_counter_ns() - t0)
            got = bytes(t.buf[slot:slot + len(record)])
            n = int.from_bytes(got[4:8], "little")
            if n != size or zlib.crc32(got[8:8 + n]).to_bytes(4, "little") != got[:4] or got != record:
                bad += 1
        action.terminate()
        with lock:
            results.append({"ops": 2 * (ops_per_client // 2), "bad": bad, "lat": lat[::16]})

    workers = [threading.Thread(target=client, args=(first_client + i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return results
