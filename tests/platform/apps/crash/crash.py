import os
import signal


def main(args, action):
    t = action.get_transport('data', 'rdma')
    t.reg(64)
    t.write(8, 0)
    print("about to crash")
    os.kill(os.getpid(), signal.SIGKILL)   # a hard crash: no Python cleanup at all
