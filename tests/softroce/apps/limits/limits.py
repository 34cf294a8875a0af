import socket


def probe(args, action):
    # With a gate (scadtest.Gate), it waits there so that the test can look at its cgroup from
    # the host's side; then it touches every page of what it allocates.
    if args.get('gate'):
        with socket.create_connection(tuple(args['gate']), timeout=60) as s:
            s.recv(1)
    chunks = [bytearray(1 << 20) for _ in range(args.get("allocate_mib", 0))]
    return {"allocated_mib": len(chunks)}
