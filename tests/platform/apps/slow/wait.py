import socket


def main(args, action):
    # The test holds a gate (scadtest.Gate): connecting tells it this runs, and it decides when
    # this ends by closing the connection (the element's timeout bounds it).
    with socket.create_connection(tuple(args['gate']), timeout=60) as s:
        s.recv(1)
    return {'waited': True}
