import json
import socket


def main(args, action):
    t = action.get_transport('data', 'rdma')
    t.reg(8)
    t.write(8, 0)
    with socket.create_connection(tuple(args['gate']), timeout=60) as s:  # the memory is in use: now it may go
        s.sendall(b'connected\n')
    notice = action.runtime.wait_peer_failure(timeout=60)
    print('peer failure: ' + json.dumps(notice), flush=True)
    return {'notice': notice, 'state': t.state}
