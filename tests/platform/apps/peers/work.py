import json
import os
import signal
import socket


def main(args, action):
    t = action.get_transport('data', 'rdma')
    t.reg(8)
    t.read(8, 0)
    if args['_instance'] == 0:
        action.runtime.invoke('data', 'scratch', {'size': 1 << 20})
        print('instance 0: invoked scratch, crashing', flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    notice = action.runtime.wait_peer_failure(timeout=50)
    print('peer failure: ' + json.dumps(notice), flush=True)
    # The test looks at what was freed, then lets this end (scadtest.Gate).
    with socket.create_connection(tuple(args['gate']), timeout=60) as s:
        s.recv(1)
    return {'notice': notice}
