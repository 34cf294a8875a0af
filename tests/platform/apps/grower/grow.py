import socket
import time


def main(args, action):
    # Waits for the test's "go" (scadtest.Gate), grows its memory, and tells the test how long
    # that took over the same connection.
    with socket.create_connection(tuple(args['gate']), timeout=60) as s:
        assert s.recv(3) == b'go\n'
        t0 = time.monotonic()
        try:
            action.runtime.invoke('tmpl', 'more', {'size': 1 << 20})
            said = f'ok {int((time.monotonic() - t0) * 1000)}\n'
        except Exception as e:
            said = f'failed {e}\n'
        s.sendall(said.encode())
    return {}
