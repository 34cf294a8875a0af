"""scad.state over memory elements the runtime makes (an element grown in segments) and its
errors, against the test runtime endpoint (real memory elements served in this process)."""
import numpy
import pytest

from scad.action import Action
from scad.state import MemoryState, StateError

WIDTH = 4096 + 8  # a slot: 512 int64 and the slot's length


def chunk(i):
    return numpy.arange(512, dtype=numpy.int64) * (i + 1)


def test_a_grown_element_keeps_its_data_where_it_is_and_gives_every_segment_back(runtime):
    action = Action("it-client")
    st = MemoryState(action)
    capacity = 2
    st.grow("stream", "template", capacity * WIDTH)
    for i in range(7):
        if i == capacity:  # twice the room, as the elastic job grows
            capacity *= 2
            st.grow("stream", "template", capacity * WIDTH)
        st.put("stream", i, chunk(i), slots=capacity)
    for i in range(7):
        assert numpy.array_equal(st.get("stream", i, numpy.int64, slots=capacity), chunk(i))
    posts = [body for verb, _, body in runtime.requests if verb == "POST"]
    # room for 2, then 2 more, then 4 more: each segment only the room added
    assert [p["props"]["size"] for p in posts] == [2 * WIDTH, 2 * WIDTH, 4 * WIDTH]
    counters = st.counters()
    # Growing moved nothing: what was written is the chunks and their lengths, and no more.
    assert counters["write_bytes"] == 7 * WIDTH and counters["read_bytes"] == 7 * WIDTH
    st.grow("stream", "template", 3 * WIDTH)  # it has that much already: nothing asked
    assert len([r for r in runtime.requests if r[0] == "POST"]) == 3
    st.release("stream")
    assert [r[0] for r in runtime.requests].count("DELETE") == 3 and runtime.elements == {}
    action.terminate()


def test_a_slot_that_spans_two_segments_is_refused(runtime):
    action = Action("it-client")
    st = MemoryState(action)
    st.grow("odd", "template", 3 * WIDTH)
    st.grow("odd", "template", 4 * WIDTH)  # 4 slots of WIDTH: slot 3 is the second segment, whole
    st.put("odd", 3, chunk(3), slots=4)
    with pytest.raises(StateError, match="spans two of its segments"):
        st.put("odd", 1, chunk(1), slots=2)  # 2 slots of 2*WIDTH: slot 1 starts in the first segment
    with pytest.raises(StateError, match="slot 5 of 4"):
        st.get("odd", 5, numpy.int64, slots=4)
    with pytest.raises(StateError, match="holds no array"):
        st.get("odd", 0, numpy.int64, slots=4)
    st.release("odd")
    assert runtime.elements == {}
    action.terminate()


def test_on_the_elements_host_a_get_is_the_slot_in_place_and_read_only(tmp_path):
    import disagg
    owner = disagg.LibdAction("owner")
    owner.add_transport(f"srv;tcp_server;size,{8 * WIDTH};path,{tmp_path / 'e.sock'}")
    srv = owner.get_transport("srv", "rdma_server")
    srv.serve(block=False)
    action = Action("it-client")
    grant = srv.grant('it-client', 0, 0, 'rw')
    action.add_transport(f"out;shm;{grant}")
    st = MemoryState(action)
    st.put("out", 3, chunk(3), slots=8)
    got = st.get("out", 3, numpy.int64, slots=8)
    assert numpy.array_equal(got, chunk(3))
    assert not got.flags.writeable, "a view of the element, read-only as Redis' answer is"
    with pytest.raises(ValueError):
        got[0] = 1
    private = st.get("out", 3, numpy.int64, slots=8, copy=True)
    # Nothing was copied: a later put to the slot shows in the view, not in the private copy.
    st.put("out", 3, chunk(5), slots=8)
    assert numpy.array_equal(got, chunk(5)) and numpy.array_equal(private, chunk(3))
    assert private.flags.writeable
    with pytest.raises(StateError, match="holds no array"):
        st.get("out", 4, numpy.int64, slots=8)
    counters = st.counters()
    assert counters["read_bytes"] == 2 * WIDTH, "a view counts the bytes it gives, as a copy does"
    with pytest.raises(TypeError):
        disagg.Mapping()  # a mapping comes from a transport's map() only
    # Once the owner ends the grant, a get says so instead of showing the pages it still maps.
    srv.revoke(grant.split("grant,")[1].split(";")[0])
    action.get_transport("out", "rdma").wait_state("ERROR", timeout=10)
    with pytest.raises(ConnectionError):
        st.get("out", 3, numpy.int64, slots=8)
    # The view got before keeps its mapping: the transport and the element's server may go first.
    action.terminate()
    assert numpy.array_equal(got, chunk(5))
    owner.terminate()
