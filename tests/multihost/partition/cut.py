import socket
import time


def main(args, action):
    # Talks with the test over a gate: "ready" once its memory (on the other host) is in use, then
    # for each "cut" from the test the error it got and how long that took, and after "healed"
    # whether it could reconnect and read its data back.
    action.config_transport('data', 'timeout_ms,1500')
    t = action.get_transport('data', 'rdma')
    t.reg(4096)
    t.buf[0:8] = b'partitio'
    t.write(8, 0)
    with socket.create_connection(tuple(args['gate']), timeout=120) as s:
        lines = s.makefile('r')
        s.sendall(b'ready\n')
        assert lines.readline() == 'cut\n'
        t0 = time.monotonic()
        try:
            t.read(8, 0, 64)
            said = 'no error'
        except (TimeoutError, ConnectionError) as e:
            said = f'{type(e).__name__} {int((time.monotonic() - t0) * 1000)}'
        s.sendall((said + '\n').encode())
        assert lines.readline() == 'healed\n'
        deadline = time.monotonic() + 30
        while True:
            try:
                t.recover()
                t.read(8, 0, 64)
                break
            except (TimeoutError, ConnectionError):
                if time.monotonic() > deadline:
                    raise
        s.sendall(f'recovered {bytes(t.buf[64:72]).decode()}\n'.encode())
    return {'ok': True}
