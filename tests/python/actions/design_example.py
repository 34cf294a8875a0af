# The example of DESIGN.md §3, unchanged.
def main(args, action):
    t = action.get_transport('mem1', 'rdma')     # KeyError if no such name/type
    t.reg(1 << 20)                               # local buffer; t.buf is a zero-copy writable memoryview
    t.buf[0:5] = b'hello'
    t.write(5, 0, 0)                             # (size, remote addr, local offset): local -> remote
    t.read(5, 0, 64)                             # remote -> local
    action.runtime.invoke('mem1', 'mem2', {'size': 1 << 30})   # new element from template, joined as 'mem2'
    action.runtime.release('mem2')
    return {'ok': True}
