"""End-to-end: op streaming, deferred errors, lifetimes, quotas and transfers, on real processes."""

from __future__ import annotations

import gc
import sys
import threading
import time

import numpy as np
import pytest
from polling import wait_for

import fabric
from fabric.arrays.origins import origin_line
from fabric.arrays.stream import (MAX_BATCH_BYTES, MAX_BATCH_ELEMENTS, MAX_BATCH_ENTRIES,
                                  REMEMBERED_ORIGINS)
from fabric.core.errors import QuotaExceeded, RemoteError
from fabric.core.flow import CREDIT_EVERY, SUBMIT_WINDOW


def submits_taken(admin: fabric.Admin, session_id: int) -> int:
    """The SUBMITs (op batches) of a session that the broker has taken, by its admin view."""
    return next(row["submits"] for row in admin.sessions() if int(row["id"], 16) == session_id)


def test_the_readme_example_matches_numpy(session):
    a_np = np.random.default_rng(1).random((200, 200))
    a = session.asarray(a_np)
    b = session.ones((200, 200), dtype="float32")
    c = (a @ b).sum(axis=0) / 2 + np.sin(a[0])
    assert isinstance(c, fabric.arrays.tensor.Tensor)
    expected = (a_np @ np.ones((200, 200), "float32")).sum(axis=0) / 2 + np.sin(a_np[0])
    assert (c.shape, c.dtype) == (expected.shape, expected.dtype)
    np.testing.assert_allclose(c.numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(c), expected, rtol=1e-12)


def test_ops_are_batched_not_sent_one_by_one(session):
    x = session.zeros(100)
    for _ in range(3000):
        x = x + 1.0
    assert len(session.stream.batch) <= MAX_BATCH_ENTRIES  # unsent work stays bounded
    assert x.numpy()[0] == 3000
    stats = session.stats()
    assert stats["ops_sent"] == 3001
    # one message per batch, not per op (a batch holds the 3000 frees too, each where the
    # client let its tensor go: after the op that read it)
    assert stats["batches_sent"] <= -(-(3001 + 3000) // MAX_BATCH_ENTRIES) + 1
    assert stats["ops"] == 3001  # the device ran every op
    last = x.id
    x = x + 1.0
    assert session.stream.batch == [(x.id, "add", last, 1.0), last]  # (compact: no params)


def test_stats_count_the_round_trips_and_reads_a_program_waited_for(session):
    before = session.stats()
    x = session.arange(10.0)
    (x * 2).sum()  # streamed: no wait
    small = float(x[3])
    large = (x + session.zeros(300_000)[:, None]).numpy()  # (through shared memory)
    session.sync()
    (x[x > 4]).shape  # a shape learned from the device
    after = session.stats()
    assert (small, large.shape) == (3.0, (300_000, 10))
    counted = {key: after[key] - before[key] for key in ("round_trips", "reads", "bytes_read")}
    assert counted == {"round_trips": 4, "reads": 2, "bytes_read": 8 + large.nbytes}


def test_a_heavy_op_is_sent_at_once_and_light_ones_wait_for_company(session):
    side = 2048  # a side x side array is MAX_BATCH_ELEMENTS elements
    assert side * side == MAX_BATCH_ELEMENTS
    small = session.zeros(100)
    light = [small + i for i in range(10)]
    assert len(session.stream.batch) == 11  # light ops are batched ...
    sent = session.stream.counts["batches_sent"]
    big = session.ones((side, side))
    assert not session.stream.batch  # ... until a heavy one comes: it goes now, with them,
    assert session.stream.counts["batches_sent"] == sent + 1  # in one message
    product = big * 2.0  # touches twice as many: sent alone, at once
    assert not session.stream.batch and session.stream.counts["batches_sent"] == sent + 2
    half = big[: side // 2]  # a view of half of it touches one and a half: sent too
    assert not session.stream.batch
    assert product.numpy()[0, 0] == 2 and half.shape == (side // 2, side)
    assert [t.numpy()[0] for t in light] == list(range(10))


def test_uploads_wait_for_company_until_their_bytes_reach_the_bound(shared_cluster):
    # (over the sockets: through shared memory, a large upload goes at once, alone)
    with fabric.connect(shared_cluster.address, token=shared_cluster.token,
                        shared_memory=False) as session:
        _uploads_wait_for_company(session)


def _uploads_wait_for_company(session: fabric.Session) -> None:
    small = [session.asarray(np.full(1000, float(i))) for i in range(3)]
    assert len(session.stream.batch) == 3 and session.stream.counts["batches_sent"] == 0
    x = small[0] + 1.0  # an op without an upload does not send them either
    assert len(session.stream.batch) == 4
    rest = MAX_BATCH_BYTES - 3 * 8000
    big = session.asarray(np.ones(rest // 8))  # the batch's bytes reach the bound: sent
    assert not session.stream.batch and session.stream.counts["batches_sent"] == 1
    assert x.numpy()[0] == 1.0 and big.numpy().sum() == rest // 8
    assert [t.numpy()[-1] for t in small] == [0.0, 1.0, 2.0]


def test_a_graph_call_counts_as_the_work_of_its_ops(session):
    traced = fabric.function(lambda x: (x * 2 + 1).sum(axis=0))
    small, big = session.zeros((4, 4)), session.ones((1024, 2048))  # big: half the bound
    light = traced(small)
    assert session.stream.batch  # a light call waits, and a heavy one (2 elementwise ops, a
    heavy = traced(big)  # reduction: 3 passes over half the bound) is sent at once
    assert not session.stream.batch
    np.testing.assert_array_equal(heavy.numpy(), np.full(2048, 3072.0))
    assert light.shape == (4,)


def test_a_shape_mismatch_fails_at_the_call_site_before_sending(session):
    a, b, c = session.zeros((3, 4)), session.zeros((5,)), session.zeros((5, 2))
    queued = len(session.stream.batch)
    with pytest.raises(ValueError):
        a + b
    with pytest.raises(ValueError):
        a @ c
    assert len(session.stream.batch) == queued


def test_a_failed_op_poisons_its_outputs_and_is_raised_at_the_next_read(session):
    ints = session.asarray(np.arange(1, 4))
    # numpy refuses negative integer powers; with a tensor exponent only the device finds out.
    bad = ints ** session.asarray(np.array([-1, -1, -1]))
    downstream = (bad + 1).sum()
    good = ints * 2
    with pytest.raises(RemoteError) as caught:
        downstream.numpy()
    error = caught.value
    assert error.details["op"] == "power"
    assert "Integers to negative integer powers" in str(error)
    assert "test_streaming.py" in error.details["origin"]  # the user's line that made the op
    # The session and the worker go on: unrelated tensors read fine, new ops run.
    np.testing.assert_array_equal(good.numpy(), [2, 4, 6])
    np.testing.assert_array_equal((good + 1).numpy(), [3, 5, 7])


def test_every_way_of_making_a_tensor_records_the_users_line(session):
    # Each call path has its own depth of fabric frames above the user's line.
    a = session.zeros((2, 3))
    makers = [
        lambda: a + 1.0,
        lambda: 1.0 - a,
        lambda: 2 ** a,
        lambda: a * a,
        lambda: -a,
        lambda: np.maximum(a, 0.5),
        lambda: np.add(1, a),
        lambda: a[0],
        lambda: a.reshape(3, 2),
        lambda: a.T,
        lambda: a.sum(axis=0),
        lambda: a.clip(0, 1),
        lambda: a + np.ones(3),
        lambda: np.sin(a),
        lambda: np.sum(a, axis=1),
        lambda: np.concatenate([a, a]),
        lambda: np.where(a, a, 0.0),
        lambda: session.zeros(3),
        lambda: session.arange(5),
        lambda: session.linspace(0, 1, 5),
        lambda: session.eye(2),
        lambda: session.random.uniform(size=3),
        lambda: session.asarray(np.ones(2)),
    ]
    for make in makers:
        tensor = make()
        assert origin_line(session.stream.origins[tensor.id]) == (__file__,
                                                            make.__code__.co_firstlineno)


def test_ops_issued_in_a_loop_each_record_their_own_line(session):
    # The origin of the op before is given again for the same call site: alternating call
    # sites, in this function and in another, must each still get their own line.
    def elsewhere(t):
        return t * 2.0
    x = session.zeros(3)
    lines = {}
    for _ in range(3):
        y = x + 1.0
        lines[y.id] = sys._getframe().f_lineno - 1
        z = elsewhere(y)
        lines[z.id] = elsewhere.__code__.co_firstlineno + 1
        x = y - z
        lines[x.id] = sys._getframe().f_lineno - 1
    assert {i: origin_line(session.stream.origins[i]) for i in lines} == {
        i: (__file__, line) for i, line in lines.items()}


def test_the_origins_of_freed_tensors_are_remembered_within_a_bound(session):
    ids = [session.zeros(1).id for _ in range(3 * REMEMBERED_ORIGINS)]  # each freed at once
    session.sync()
    kept = [i for i in ids if i in session.stream.origins]
    assert REMEMBERED_ORIGINS <= len(kept) < 2 * REMEMBERED_ORIGINS
    assert kept == ids[-len(kept):]  # the last freed


def test_sync_raises_the_first_error_once(session):
    session.asarray(np.arange(3)) ** session.asarray(np.array([-2, -2, -2]))  # freed at once
    line = sys._getframe().f_lineno - 1
    with pytest.raises(RemoteError, match="power") as caught:
        session.sync()
    assert caught.value.details["origin"] == f"{__file__}:{line}"  # a freed tensor's line too
    session.sync()  # reported once; the session is healthy again


def test_garbage_collected_tensors_are_freed_on_the_worker(session):
    kept = session.ones(1000)
    dropped = [session.ones(1000) for _ in range(10)]
    session.sync()
    assert session.stats()["tensors"] == 11
    del dropped
    gc.collect()
    stats = session.stats()
    assert stats["tensors"] == 1
    assert stats["resident_bytes"] == kept.nbytes


def test_tensors_let_go_in_another_thread_while_ops_stream_are_all_freed(session):
    # A free is appended from whichever thread lets the tensor go, also while this thread
    # sends the batch: none may be lost (the worker would hold it until the session closes).
    made = [session.ones(10) for _ in range(3000)]
    session.sync()

    def let_go() -> None:
        while made:
            made.pop()
            time.sleep(0)  # (lets the other thread in between frees)

    dropper = threading.Thread(target=let_go)
    x = session.zeros(10)
    dropper.start()
    for _ in range(20_000):
        x = x + 1.0
    dropper.join(timeout=30)
    assert not dropper.is_alive()
    assert x.numpy()[0] == 20_000
    stats = session.stats()
    assert (stats["tensors"], stats["ops_sent"]) == (1, 3000 + 1 + 20_000)


def test_closing_a_session_frees_everything_it_held(shared_cluster):
    with shared_cluster.connect(device=1) as first:
        kept = first.ones(10_000)  # (held until the session closes)
        first.sync()
        held = first.stats()["device_resident_bytes"]
        assert kept.nbytes == 80_000
    assert held >= 80_000
    with shared_cluster.connect(device=1) as second:
        stats = second.stats()
        assert stats["device_sessions"] == 1
        assert stats["device_resident_bytes"] == 0


def test_memory_limit_gives_quota_exceeded_and_the_worker_survives():
    with fabric.LocalCluster(workers=1, worker_args=("--memory-limit", "100000")) as cluster:
        with cluster.connect() as session:
            small = session.ones(1000)  # 8 kB
            big = session.ones(20_000)  # 160 kB: past the limit
            with pytest.raises(QuotaExceeded, match="memory-limit"):
                big.numpy()
            assert small.sum().numpy() == 1000
            del big
            session.sync()
        with cluster.connect() as again:
            assert again.arange(5).sum().numpy() == 10


def test_a_loop_under_a_memory_limit_holds_only_its_live_tensors():
    # Each tensor is freed on the worker where the client let it go, within the batch.
    with fabric.LocalCluster(workers=1, worker_args=("--memory-limit", "100000")) as cluster:
        with cluster.connect() as session:
            x = session.ones(5000)  # 40 kB: two fit, three do not
            for _ in range(50):  # 2 MB, were the batch's tensors freed only at its end
                x = x + 1.0
            assert x.numpy()[0] == 51.0
            assert session.stats()["batches_sent"] == 1


@pytest.mark.parametrize("make", [
    lambda: np.arange(24.0).reshape(4, 6)[:, ::2],  # non-contiguous
    lambda: np.arange(24.0).reshape(4, 6).T,  # Fortran order
    lambda: np.arange(10, dtype=">f8"),  # big-endian
    lambda: np.arange(10, dtype=">i4"),
    lambda: np.array([True, False, True]),
    lambda: np.array([1 + 2j, -3.5j]),
    lambda: np.float16([0.5, 1.5]).reshape(2, 1),
    lambda: np.zeros((0, 3)),
    lambda: np.float32(2.5).reshape(()),
], ids=["strided", "transposed", "big-endian-float", "big-endian-int", "bool", "complex",
        "half-2d", "empty", "0-d"])
def test_uploads_of_any_layout_read_back_equal(session, make):
    original = make()
    back = session.asarray(original).numpy()
    np.testing.assert_array_equal(back, original)
    assert back.dtype == original.dtype.newbyteorder("=")
    assert back.flags.writeable and back.flags.owndata or back.base is not None
    back[...] = 0  # an ordinary writable array


def test_large_arrays_travel_intact(session):
    original = np.random.default_rng(7).random(3_000_000)  # 24 MB: zero-copy frames
    tensor = session.asarray(original)
    back = tensor.numpy()
    np.testing.assert_array_equal(back, original)
    back[0] = -1.0
    assert tensor[0].numpy() == original[0]  # the client's copy is its own


def test_seeded_random_is_reproducible(session, shared_cluster):
    session.random.seed(42)
    first = session.random.normal(size=(3, 4)).numpy()
    session.random.seed(42)
    again = session.random.normal(size=(3, 4)).numpy()
    with shared_cluster.connect(device=1) as other:
        other.random.seed(42)
        elsewhere = other.random.normal(size=(3, 4)).numpy()
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first, elsewhere)


def test_a_tensor_from_another_session_is_refused(session, shared_cluster):
    with shared_cluster.connect(device=1) as other:
        with pytest.raises(ValueError, match="another session"):
            session.ones(3) + other.ones(3)


def test_unsupported_numpy_functions_raise_type_error_instead_of_downloading(session):
    t = session.ones(5)
    with pytest.raises(TypeError, match="unwrap"):
        np.unwrap(t)
    with pytest.raises(TypeError, match="reduceat"):
        np.add.reduceat(t, [0, 2])


def test_using_a_closed_session_fails_clearly(shared_cluster):
    session = shared_cluster.connect(device=0)
    tensor = session.ones(3)
    session.close()
    with pytest.raises(fabric.SessionLost, match="closed"):
        tensor.numpy()
    with pytest.raises(fabric.SessionLost, match="closed"):
        session.ones(3)


def test_an_op_from_another_thread_is_refused_at_once_and_the_session_goes_on(session):
    t = session.arange(4.0)
    queued = len(session.stream.batch)
    errors = []

    def use_from_another_thread():
        for issue in (lambda: t + 1, lambda: session.ones(2), lambda: session.asarray([1.0]),
                      lambda: t.numpy(), lambda: session.sync()):
            try:
                issue()
            except fabric.FabricError as exc:
                errors.append(str(exc))
    thread = threading.Thread(target=use_from_another_thread)
    thread.start()
    thread.join(timeout=10)
    # before: the ops were queued into this thread's stream, and only a read failed
    assert len(errors) == 5 and all("call fabric.connect() in each thread" in e for e in errors)
    assert len(session.stream.batch) == queued  # nothing of the other thread's was queued
    np.testing.assert_array_equal((t * 2).numpy(), [0.0, 2.0, 4.0, 6.0])


def test_a_session_with_a_long_queue_does_not_hold_up_another_sessions_requests(
        shared_cluster):
    with shared_cluster.connect(device=1) as busy, shared_cluster.connect(device=1) as other:
        big, small = busy.ones(25_000_000), busy.ones((1000, 1000))
        busy.sync()
        kept = [np.sin(big)]  # a long op, on one core: the messages below reach the device
        busy.flush()
        for _ in range(40):
            kept.append(small + 1.0)
            busy.flush()
        # The broker has forwarded them all (in order, before anything sent after): the
        # device's queue is long.
        with shared_cluster.admin() as admin:
            wait_for(lambda: submits_taken(admin, busy.id)
                     == busy.stream.counts["batches_sent"], 10, "the broker to take them",
                     interval=0.01)  # (looked at soon: the device works through them)
        before = big.nbytes + small.nbytes + kept[0].nbytes
        # other's request takes its turn after the message running now, not after all 40.
        done = (other.stats()["device_resident_bytes"] - before) // small.nbytes
        assert done < 20
        busy.sync()
        assert (other.stats()["device_resident_bytes"] - before) // small.nbytes == 40
        np.testing.assert_array_equal(kept[-1][0, :3].numpy(), [2.0] * 3)


def test_a_session_streaming_faster_than_its_device_waits_for_it(session):
    big, x = session.ones(25_000_000), session.zeros(10)
    session.sync()
    kept = np.sin(big)  # the device is busy a while ...
    session.flush()
    in_flight = []
    for _ in range(3 * SUBMIT_WINDOW):  # ... while more batches than the window are sent
        x = x + 1.0
        session.flush()
        in_flight.append(session.stream.counts["batches_sent"]
                         - session.connection.pending.done.get(session.id, 0))
    assert max(in_flight) == SUBMIT_WINDOW  # it waited for the device instead of flooding
    assert x.numpy()[0] == 3 * SUBMIT_WINDOW
    del kept


def test_a_device_busy_past_the_timeout_makes_sending_more_raise_and_loses_nothing(
        shared_cluster):
    with shared_cluster.connect(device=1, timeout=0.5) as busy:
        a, b = busy.ones((2500, 2500)), busy.full((2500, 2500), 1 / 2500)
        x = busy.zeros(10)
        busy.sync()
        for _ in range(6):  # seconds of matmuls, in one batch
            a = a @ b
        busy.flush()
        with pytest.raises(fabric.RequestTimeout, match="busy with long ops") as caught:
            for sent in range(2 * SUBMIT_WINDOW):
                x = x + 1.0
                busy.flush()
        assert caught.value.details["waiting"] == SUBMIT_WINDOW
        busy.sync(timeout=60)  # the batch that could not be sent goes with it
        assert x.numpy()[0] == sent + 1
        np.testing.assert_allclose(a[0, :3].numpy(), [1.0] * 3)


def test_a_closed_sessions_credit_is_forgotten(shared_cluster):
    with shared_cluster.connect(device=0) as first:
        with first.open(device=0) as second:
            x = second.zeros(1)
            for _ in range(CREDIT_EVERY):
                x = x + 1.0
                second.flush()
            second.sync()
            assert first.connection.pending.done[second.id] == CREDIT_EVERY
        assert second.id not in first.connection.pending.done  # no entry left per session


def test_a_read_of_a_tensor_made_before_the_batch_goes_alone_and_the_batch_waits(session):
    older, index = session.asarray(np.arange(4.0)), session.asarray(np.array([7]))
    session.flush()
    newer = older * 2  # queued, not sent ...
    bad = older[index]  # ... and an op that will fail on the device (out of bounds)
    np.testing.assert_array_equal(older.numpy(), np.arange(4.0))  # (needs neither)
    assert len(session.stream.batch) == 2  # they wait for the next send
    np.testing.assert_array_equal(newer.numpy(), np.arange(4.0) * 2)  # carries the batch
    assert session.stream.batch == []
    with pytest.raises(RemoteError, match="getitem"):
        bad.numpy()
