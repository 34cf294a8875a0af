import pathlib


def probe(args, action):
    line = next(l for l in pathlib.Path("/proc/self/cgroup").read_text().splitlines() if l.startswith("0::"))
    cg = pathlib.Path("/sys/fs/cgroup") / line[3:].lstrip("/")
    chunks = [bytearray(1 << 20) for _ in range(args.get("allocate_mib", 0))]  # every page touched
    return {"cgroup": str(cg), "cpu.max": (cg / "cpu.max").read_text().strip(),
            "memory.max": (cg / "memory.max").read_text().strip(), "allocated_mib": len(chunks)}
