import sys


def main(args, action):
    t = action.get_transport('mem1', 'rdma')
    t.reg(64)
    t.write(8, 0)
    print("user output goes to stderr")
    if args.get('how') == 'raise':
        raise RuntimeError('the action failed on purpose')
    if args.get('how') == 'exit':
        sys.exit(3)
    if args.get('how') == 'not-json':
        return {'value': object()}
    return {'fine': True}
