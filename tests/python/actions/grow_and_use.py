# Grows its memory at run time, uses it, checks the data, releases it.
def main(args, action):
    t = action.runtime.invoke('mem1', 'scratch', {'size': args['size']})
    t.reg(4096)
    t.buf[0:4] = b'grow'
    t.write(4, args['size'] - 4)
    t.read(4, args['size'] - 4, 100)
    seen = bytes(t.buf[100:104]).decode()
    action.runtime.release('scratch')
    return {'seen': seen, 'transports': action.transport_names()}
