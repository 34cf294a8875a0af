"""Load on one memory element: 64 clients (8 processes of 8 threads, each client its own
connection) write checksummed records of random sizes into their own slots and read them back.
Zero corruption is required; operations per second and the p99 of a write+read pair are reported."""
import multiprocessing
import time

import pytest

import load_client

CLIENTS, PROCESSES = 64, 8
SLOT = 4096


@pytest.mark.parametrize("impl, ops", [("shm", 1_000_000), ("tcp", 1_000_000)])
def test_64_clients_on_one_element_move_every_byte_intact(memd, impl, ops, record_property):
    server = memd(element=f"mem1={CLIENTS * SLOT}", client="*")
    per_process = CLIENTS // PROCESSES
    ctx = multiprocessing.get_context("spawn")
    t0 = time.monotonic()
    with ctx.Pool(PROCESSES) as pool:
        jobs = [pool.apply_async(load_client.run, (server.config(), impl, p * per_process, per_process,
                                                   ops // CLIENTS, SLOT)) for p in range(PROCESSES)]
        results = [r for job in jobs for r in job.get(600)]
    elapsed = time.monotonic() - t0
    assert len(results) == CLIENTS
    done = sum(r["ops"] for r in results)
    bad = sum(r["bad"] for r in results)
    lat = sorted(x for r in results for x in r["lat"])
    p99 = lat[int(len(lat) * 0.99)] / 1000
    record_property("ops_per_s", int(done / elapsed))
    print(f"\n{impl}: {CLIENTS} clients, {done} operations in {elapsed:.1f} s ({done / elapsed:,.0f} ops/s "
          f"with process start-up), write+read p99 {p99:.0f} us, {bad} corrupt")
    assert done >= ops - CLIENTS * 2 and bad == 0
