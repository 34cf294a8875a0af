import json


def main(args, action):
    t = action.get_transport('data', 'rdma')
    t.reg(8)
    t.write(8, 0)
    with open(args['fifo'], 'w') as f:  # tells the test the memory is in use: now it may go
        f.write('connected\n')
    notice = action.runtime.wait_peer_failure(timeout=60)
    print('peer failure: ' + json.dumps(notice), flush=True)
    return {'notice': notice, 'state': t.state}
