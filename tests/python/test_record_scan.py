"""The one-pass reader of the records a peer parses before every operation (disagg's
scan_connect_record and scan_buffer_record, under RdmaMetadata.from_json and RdmaBuffer.from_json):
it takes a record exactly as to_json writes it; whatever it takes, the json parser takes too, with
the very same values; everything else it leaves to the json parser (None), which says what is wrong.
Checked on records real operations make, on those with each field set to the values at the edges
of what the parser accepts, and on many thousands of small random corruptions of them."""
import json
import math
import random

import numpy
import pytest

import disagg
from scad.connect import Connector, Descriptor, RdmaMetadata
from scad.rdma import RdmaBuffer
from scad.rdma import _buffer

# Characters that matter to JSON and to the checks (separators of libd's configuration strings,
# escapes, what is not ASCII or not printable), for the corruptions.
ALPHABET = list('{}[],:"\\ -+.0123456789eEtrufalsn;x') + ["\u00e9", "\x00", "\x1f", "\x7f", "\t"]


def corruptions(text, rng, count):
    """`count` copies of text, each with one to three characters deleted, inserted or replaced."""
    for _ in range(count):
        t = text
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(t) + 1)
            how = rng.randrange(3)
            if how == 0 and i < len(t):
                t = t[:i] + t[i + 1:]
            elif how == 1:
                t = t[:i] + rng.choice(ALPHABET) + t[i:]
            elif i < len(t):
                t = t[:i] + rng.choice(ALPHABET) + t[i + 1:]
        yield t


def canonical(raw):
    """A record with edited values in to_json's layout (the fields in order, no whitespace)."""
    return json.dumps(raw, separators=(",", ":"))


def same_float(a, b):
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b) or (math.isnan(a) and math.isnan(b))


def check_connect(text):
    """True if the scanner took text. Fails if it took what json refuses or read other values."""
    fast = disagg.scan_connect_record(text)
    try:
        slow = RdmaMetadata.from_dict(json.loads(text))
    except Exception:  # noqa: BLE001 - any refusal: the scanner must have left it alone
        assert fast is None, f"the scanner took a record the json parser refuses: {text!r}"
        return False
    if fast is None:
        return False
    got = RdmaMetadata.from_json(text)
    assert got == slow and same_float(got.expires_at, slow.expires_at), text
    assert [tuple(d) for d in got.descriptors] == [tuple(d) for d in slow.descriptors]
    return True


def check_buffer(text, monkeypatch):
    """As check_connect; the scanner leaves a list buffer's ranges to RdmaBuffer (which checks them
    as for a record json read), so a record it took may still be refused there, with json's words."""
    fast = disagg.scan_buffer_record(text)
    with monkeypatch.context() as m:
        m.setattr(_buffer, "from_binding", lambda name: None)  # RdmaBuffer.from_json with json alone
        try:
            slow, refusal = RdmaBuffer.from_json(text), None
        except Exception as e:  # noqa: BLE001
            slow, refusal = None, e
    if fast is None:
        return False
    if refusal is not None:
        assert fast[-1] is not None, f"the scanner took a record the json parser refuses: {text!r}"
        with pytest.raises(type(refusal)) as got:
            RdmaBuffer.from_json(text)
        assert str(got.value) == str(refusal)
        return False
    got = RdmaBuffer.from_json(text)
    assert got == slow and got.ranges == slow.ranges and got.route == slow.route, text
    return True


@pytest.fixture(scope="module")
def connect_records():
    with Connector() as c:
        one = c.create_readable(Descriptor(numpy.zeros(64, dtype=numpy.uint8)))
        listed = c.create_writable([Descriptor(numpy.zeros(100, dtype=numpy.uint8)), Descriptor(bytearray(10)),
                                    Descriptor(bytearray(3))])
        texts = [one.metadata().to_json(), listed.metadata().to_json()]
        one.cancel()
        listed.cancel()
    return texts


@pytest.fixture(scope="module")
def buffer_records():
    # Handles made directly (the process's RdmaManager keeps what it lent, for other tests to see).
    where = dict(owner="scad-rdma-0123456789abcdef", hostname="vm", host="127.0.0.1", port=35567,
                 path="/tmp/scad-rdma-0123456789abcdef.sock", verbs=False, grant="g8c1ad6c1bdfa41d0_0",
                 secret="ab6b0c01006ff83ddc5247bf09e19c5867c937b8bdd942a529dc3259f4216ab8")
    one = RdmaBuffer(**where, offset=0, size=64, whole=True)
    listed = RdmaBuffer(**where, offset=0, size=72, whole=True, ranges=[64, 8])
    part = RdmaBuffer(**where, offset=8, size=16, whole=False)
    return [one.to_json(), listed.to_json(), listed.to_json(with_ranges=False), part.to_json()]


def test_records_as_to_json_writes_them_are_read_in_one_pass(connect_records, buffer_records, monkeypatch):
    for text in connect_records:
        assert disagg.scan_connect_record(text) is not None and check_connect(text)
        assert RdmaMetadata.from_json(text).to_json() == text
    for text in buffer_records:
        assert disagg.scan_buffer_record(text) is not None and check_buffer(text, monkeypatch)
    # Anything else is json's: other spacing, bytes, another record kind.
    raw = json.loads(connect_records[0])
    assert disagg.scan_connect_record(json.dumps(raw)) is None and check_connect(json.dumps(raw)) is False
    assert disagg.scan_connect_record(connect_records[0].encode()) is None
    assert disagg.scan_connect_record(buffer_records[0]) is None and disagg.scan_buffer_record(connect_records[0]) is None


def test_each_field_at_the_edges_reads_as_json_reads_it(connect_records, buffer_records, monkeypatch):
    raw = json.loads(connect_records[1])
    first = raw["descriptors"][0]
    edits = {
        "version": [0, 1, 2, 3, True, 2.0, -1],
        "operation_kind": [0, 1, 2, 3, True, 1.0],
        "notification_key": ["0123456789abcdef", "0123456789ABCDEF", "0123456789abcde", "0123456789abcdef0", 7],
        "owner": ["", "a;b", "x" * 300, 5, None],
        "hostname": ["", "h,1", True],
        "host": ["10.0.0.1", "h;port,1", "h,1", ""],
        "port": [0, 1, 65535, -1, 2 ** 62, 2 ** 63, 10 ** 30, "1", True, 1.0],
        "path": ["", "/tmp/a;grant,x", "/tmp/a,b", "/t"],
        "verbs": [True, False, 0, 1, None],
        "expires_at": [0, -0, 0.0, -0.0, 1.5, -2.25e-3, 1e300, 1e999, 10 ** 30, 1795921115.0881166, "soon", True, None],
    }
    checked = 0
    for field, values in edits.items():
        for value in values:
            checked += check_connect(canonical(dict(raw, **{field: value})))
    descriptor_edits = [
        [dict(first, size=0)], [dict(first, size=-1)], [dict(first, size=10 ** 18)], [dict(first, size=10 ** 19)],
        [dict(first, size=True)], [dict(first, size=1.0)], [dict(first, device=7)], [dict(first, device=None)],
        [dict(first, grant="")], [dict(first, grant="a;b")], [dict(first, secret="a,b")], [dict(first, secret=3)],
        [{"size": 5, "device": "cpu"}], [first, {"size": 5, "device": "cpu"}],
        [first, {"size": 5, "device": "cpu", "grant": first["grant"]}], [first, {"device": "cpu", "size": 5}],
        [], [first] * 3, [dict(first, extra=1)],
    ]
    for descs in descriptor_edits:
        checked += check_connect(canonical(dict(raw, descriptors=descs)))
        checked += check_connect(canonical(dict(raw, version=1, descriptors=descs)))
    assert checked >= 20, "the edits that stay valid were read in one pass"

    braw = json.loads(buffer_records[1])
    bedits = {
        "version": [1, 2, 3, True],
        "port": [0, -1, 2 ** 63, "1"],
        "grant": ["", "g;x", 5], "secret": ["", "s,x"],
        "offset": [0, 1, -1, 10 ** 19, True], "size": [0, 1, 72, -5, 1.0],
        "whole": [True, False, 0, None],
        "ranges": [[64, 8], [72], [], [0, 72], [-1, 73], [64, 8.0], [True], "64,8", None, [64, 8, 0], list(range(1, 3000))],
        "host": ["h;x"], "path": ["/p,q"], "owner": ["o;k"],
    }
    checked = 0
    for field, values in bedits.items():
        for value in values:
            checked += check_buffer(canonical(dict(braw, **{field: value})), monkeypatch)
            without = {k: v for k, v in braw.items() if k != "ranges"}
            checked += check_buffer(canonical(dict(without, **{field: value})), monkeypatch)
    assert checked >= 10


def test_random_corruptions_are_refused_or_read_as_json_reads_them(connect_records, buffer_records, monkeypatch):
    rng = random.Random(20261129)
    taken = 0
    for text in connect_records:
        for bad in corruptions(text, rng, 6000):
            taken += check_connect(bad)
    for text in buffer_records:
        for bad in corruptions(text, rng, 4000):
            taken += check_buffer(bad, monkeypatch)
    # Many corruptions still make a valid record (a digit of a key or a size changed): those the
    # scanner reads too, the same.
    assert taken > 1000
