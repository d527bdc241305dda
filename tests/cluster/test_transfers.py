"""Moving tensors between sessions needs the destination's consent (issue 30, high 2).

``t.to(other)`` makes ``other``'s device agree first to take a new tensor, with a one-time
ticket only its client knows; the sending device attaches the ticket. A client that knows
another's session id (and its tensor ids, which count up from 1) sends its own tensor there
with a guessed ticket, or in the old form that named the tensor id to fill: the tensor never
lands, nothing there is replaced or charged, on both paths (through the broker to another
worker, and in memory on one worker).
"""

from __future__ import annotations

import numpy as np
import pytest
from polling import wait_for

import fabric
from fabric.core.flow import EARLY_TRANSFER_BYTES


def _devices(cluster) -> dict[str, int]:
    return {device.worker: device.index for device in cluster.devices()}


@pytest.mark.parametrize("path", ["same worker", "other worker"])
def test_a_move_lands_only_where_it_was_agreed_to(cluster, path):
    devices = _devices(cluster)
    victim_device = devices["worker-0"]
    attacker_device = victim_device if path == "same worker" else devices["worker-1"]
    with cluster.connect(device=victim_device, timeout=5) as victim, \
            cluster.connect(device=attacker_device, timeout=5) as attacker:
        kept = victim.asarray(np.arange(4.0))
        before = victim.stats()
        payload = attacker.asarray(np.full(100_000, 7.0))
        for params in ({"session": victim.id, "ticket": 1},  # a guessed ticket
                       {"session": victim.id, "ticket": kept.id},
                       {"session": victim.id, "id": kept.id}):  # naming the tensor to fill
            attacker.stream.enqueue(["send", 0, [payload.id], params])
        attacker.flush()
        with pytest.raises(fabric.ProtocolError) as refused:  # the ticketless form: its own op
            attacker.sync(timeout=5)
        assert "ticket" in str(refused.value)
        assert (payload + 1).sum().numpy() == 800_000.0  # the attacker's session goes on
        # (the refused TRANSFERs reach the victim's device after the attacker's sync)
        wait_for(lambda: victim.stats()["transfers_refused"]
                 - before["transfers_refused"] >= 2, 5, "both refusals")
        after = victim.stats()
        assert after["transfers_refused"] - before["transfers_refused"] == 2
        assert after["tensors"] == before["tensors"]
        assert after["resident_bytes"] == before["resident_bytes"]  # nothing charged
        assert np.array_equal(kept.numpy(), np.arange(4.0))  # nothing replaced
        moved = payload.to(victim)  # a move the victim's client makes is taken
        assert moved.sum().numpy() == 700_000.0


def test_a_ticket_is_used_once(cluster):
    devices = _devices(cluster)
    with cluster.connect(device=devices["worker-0"], timeout=5) as a, \
            cluster.connect(device=devices["worker-1"], timeout=5) as b:
        source = a.asarray(np.arange(3.0))
        moved = source.to(b)
        assert moved.numpy().tolist() == [0.0, 1.0, 2.0]
        # The same ticket again (as if replayed): the first move's tensor stays as it was.
        ticket = 12345
        b._call({"op": "expect", "id": 10_000, "ticket": ticket})
        for _ in range(2):
            a.stream.enqueue(["send", 0, [a.asarray(np.ones(3)).id],
                              {"session": b.id, "ticket": ticket}])
            a.flush()
        a.sync(timeout=5)
        b._call({"op": "await", "id": 10_000})
        assert b.stats()["transfers_refused"] == 1


def test_moves_made_at_once_carry_poison_and_fail_together_cleanly(cluster):
    from fabric.transport.moves import move_all

    devices = _devices(cluster)
    with cluster.connect(device=devices["worker-0"], timeout=5) as here:
        there, closed = (here.open(device=devices["worker-1"]) for _ in range(2))
        good = here.asarray(np.arange(6.0))
        singular = np.linalg.inv(here.zeros((2, 2)))  # fails on the device: poisoned
        moved = move_all([(good, there), (singular, there), (good * 2, there), (good, here)])
        assert moved[3] is good and {t.session for t in moved[:3]} == {there}
        np.testing.assert_array_equal(moved[2].numpy(), np.arange(6.0) * 2)
        with pytest.raises(fabric.RemoteError, match="inv"):  # the poison moved with it
            moved[1].numpy()
        closed.close()
        with pytest.raises(fabric.SessionLost):  # a target closed: refused at once ...
            move_all([(good, there), (good, closed)])
        assert not here.connection.pending._waiting  # ... after the others answered
        np.testing.assert_array_equal((good.to(there) + 1).numpy(), np.arange(6.0) + 1)


@pytest.mark.parametrize("size, at_once", [(3, True), (EARLY_TRANSFER_BYTES // 8 + 1, False)])
def test_a_move_whose_transfer_is_small_goes_without_waiting_for_its_agreement(cluster, size,
                                                                                at_once):
    """A move sends its ``expect``, its ``send`` and its ``await`` before it waits for any
    answer where its TRANSFER is small (one wait, where there were two: the receiving device
    keeps a TRANSFER that comes before its ticket); a larger one, its bytes in the TRANSFER
    (no shared memory), waits for the receiving device's agreement first."""
    devices = _devices(cluster)
    with fabric.connect(cluster.address, token=cluster.token, device=devices["worker-0"],
                        timeout=5, shared_memory=False) as a, \
            fabric.connect(cluster.address, token=cluster.token, device=devices["worker-1"],
                           timeout=5, shared_memory=False) as b:
        values = np.arange(float(size))
        source = a.asarray(values)
        a.sync()
        sends = a.stream.counts["batches_sent"]
        sent_at_first_wait = []
        reply = b._reply  # (b's answers are waited for here, each call passed on)
        b._reply = lambda request, timeout=None: (
            sent_at_first_wait.append(a.stream.counts["batches_sent"]), reply(request, timeout)
        )[1]
        moved = source.to(b)
        del b._reply
        assert sent_at_first_wait[0] == sends + at_once  # (the send's batch had gone, or not)
        assert len(sent_at_first_wait) == 2  # (the expect's answer, and the await's)
        np.testing.assert_array_equal(moved.numpy(), values)
        assert b.stats()["transfers_refused"] == 0
