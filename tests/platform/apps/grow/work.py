def main(args, action):
    props = {'size': args.get('size', 8 << 20)}
    if 'prefetch' in args:
        props['prefetch'] = args['prefetch']
    t = action.runtime.invoke('scratch_tmpl', 'scratch', props)
    t.reg(4096)
    t.buf[0:5] = b'grown'
    t.write(5, args.get('size', 8 << 20) - 5)
    t.read(5, args.get('size', 8 << 20) - 5, 64)
    size, rights = t.remote()
    action.runtime.release('scratch')
    try:
        t.read(5, 0)
        after = 'still readable'
    except ConnectionError:
        after = 'refused'
    return {'read_back': bytes(t.buf[64:69]).decode(), 'size': size, 'after_release': after}
