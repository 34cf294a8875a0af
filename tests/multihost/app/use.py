import os


def main(args, action):
    t = action.get_transport('data', 'rdma')
    t.reg(1 << 20)
    payload = os.urandom(1 << 20)
    t.buf[:] = payload
    t.write(1 << 20, 32 << 20)
    t.buf[:] = bytes(1 << 20)
    t.read(1 << 20, 32 << 20)
    return {'verified': bytes(t.buf) == payload, 'impl': t.impl}
