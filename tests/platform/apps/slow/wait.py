def main(args, action):
    # Opening a FIFO blocks until the test opens its other end: the test decides when this runs
    # and when it ends (the element's timeout bounds it).
    with open(args['fifo']) as f:
        f.read()
    return {'waited': True}
