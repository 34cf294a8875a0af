import socket


def main(args, action):
    # What the element reaches: the scheduler over tcp, its memory over the transport it was
    # wired with, the runtime endpoint. `sealed` (no network) writes; `open`, its dependent, reads
    # back and returns both findings.
    found = {}
    host, port = args["scheduler"]
    try:
        socket.create_connection((host, port), timeout=5).close()
        found["tcp"] = "connected"
    except OSError as e:
        found["tcp"] = type(e).__name__
    t = action.get_transport("data", "rdma")
    t.reg(64)
    if "sealed" in args:
        t.read(5, 0)
        found["read_back"] = bytes(t.buf[0:5]).decode()
    else:
        t.buf[0:5] = b"wrote"
        t.write(5, 0)
    try:
        action.runtime.invoke("data", "more", {"size": 4096})
        found["runtime"] = "reached"
    except Exception as e:
        found["runtime"] = str(e)
    if "sealed" in args:
        return {"sealed": args["sealed"][0], "open": found}
    return found
