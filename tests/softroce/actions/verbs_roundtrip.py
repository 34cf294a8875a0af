# A compute element that moves data over verbs: writes a pattern, reads it back, in one call and
# as a batch of async operations, and reports what the transport saw.
def main(args, action):
    t = action.get_transport('mem1', 'rdma')
    n, base = args['size'], args['offset']
    t.reg(2 * n)
    pattern = bytes((i * 7 + 3) % 251 for i in range(n))
    t.buf[0:n] = pattern
    t.write(n, base, 0)
    t.read(n, base, n)
    same = bytes(t.buf[n:2 * n]) == pattern
    # Four async writes of quarters, in flight together, then one read of the whole.
    q = n // 4
    t.buf[0:n] = bytes(reversed(pattern))
    ops = [t.write_async(q, base + i * q, i * q) for i in range(4)]
    for op in ops:
        op.wait()
    t.read(4 * q, base, n)
    same_async = bytes(t.buf[n:n + 4 * q]) == bytes(reversed(pattern))[:4 * q]
    st = t.stats()
    return {'same': same, 'same_async': same_async, 'writes': st['write_ops'], 'reads': st['read_ops']}
