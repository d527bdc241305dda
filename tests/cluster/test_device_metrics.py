"""What workers report of their devices in heartbeats, and how /metrics shows it: a real
cluster scraped with prometheus_client's own parser before and after a known workload, a raw
worker sending malformed reports, and the report's codec, tally and families sans I/O."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fabric
from fabric import LocalCluster
from fabric.broker.admin_service import devices as admin_devices
from fabric.broker.metrics import families, figures
from fabric.broker.model import Side
from fabric.core import protocol
from fabric.core.errors import ProtocolError, error_from_wire
from fabric.core.protocol import (MAX_REPORTED_SESSIONS, OP_SECONDS_BUCKETS, DeviceReport, Kind,
                                  LinkReport, Message, SessionReport, WorkerReport,
                                  decode_report, report_body)
from fabric.core.shm import START_SLOT_BYTES
from fabric.workers.tally import DeviceTally
from conftest import HEARTBEAT
from polling import wait_for
from rawpeers import RawDealer, frames_of
from test_admin_commands import busy_registry
from test_metrics import Samples, scrape, value
from test_registry import A, B, frames, kinds, make_registry, register_frames

DEVICE = {"device": "0", "worker": "worker-0"}
BUCKETS = len(OP_SECONDS_BUCKETS) + 1


@pytest.fixture(scope="module")
def metered():
    with LocalCluster(workers=1, heartbeat=HEARTBEAT,
                      broker_args=("--metrics", "127.0.0.1:0")) as running:
        yield running


def scrape_until(url: str, done, what: str) -> Samples:
    """Scrape until ``done(samples)``: a worker's figures reach the broker with its next
    heartbeat (HEARTBEAT apart; 30 s is a bound for safety, half the test's timeout)."""
    def scraped() -> tuple[Samples] | None:
        samples = scrape(url)
        return (samples,) if done(samples) else None
    return wait_for(scraped, 30, f"{what} at {url}")[0]


def histogram(samples: Samples, **labels: str) -> list[float]:
    """The cumulative bucket counts of fabric_device_op_seconds, in bucket order."""
    return [value(samples, "fabric_device_op_seconds_bucket", **labels, le=le)
            for le in [*map(str, OP_SECONDS_BUCKETS), "+Inf"]]


def test_ops_op_time_memory_and_graph_hits_move_by_the_workload(metered):
    url = metered.metrics_url
    before = scrape_until(url, lambda s: ("fabric_device_ops_total",
                                          frozenset(DEVICE.items())) in s, "device 0's figures")

    def moved(samples: Samples, name: str) -> float:
        return value(samples, name, **DEVICE) - value(before, name, **DEVICE)

    @fabric.function
    def scaled(x):
        return x * 2 + 1

    with metered.connect() as session:
        a = session.asarray(np.ones((100, 100)))  # one op (put)
        for _ in range(20):  # twenty ops, each freeing the one before (a free is no op)
            a = a + 1
        total = a.sum()  # one op
        for _ in range(3):  # registered once (one op), then three calls (one op each)
            scaled(a)
        assert total.numpy() == 210000.0  # the read carries the batch
        expected_ops = 1 + 20 + 1 + 1 + 3
        assert session.stats()["ops"] == expected_ops
        during = scrape_until(url, lambda s: moved(s, "fabric_device_ops_total")
                              >= expected_ops, f"{expected_ops} more ops")
        assert moved(during, "fabric_device_ops_total") == expected_ops
        assert moved(during, "fabric_device_op_seconds_count") == expected_ops
        assert moved(during, "fabric_device_op_seconds_sum") > 0
        buckets = histogram(during, **DEVICE)
        assert buckets == sorted(buckets)  # cumulative
        assert buckets[-1] == value(during, "fabric_device_op_seconds_count", **DEVICE)
        assert moved(during, "fabric_device_graph_registrations_total") == 1
        assert moved(during, "fabric_device_graph_replays_total") == 2  # the 2nd and 3rd call
        # What the session holds now: a and its sum (the results of scaled were let go).
        held = a.nbytes + total.nbytes
        assert session.stats()["device_resident_bytes"] == held
        # The device's memory: the session's, and its own pool's (the start slot lent to the
        # session, and the segment kept ready for the next: test_start_slot)
        pool = value(during, "fabric_device_shared_memory_pool_bytes", **DEVICE)
        assert pool == 2 * START_SLOT_BYTES
        assert value(during, "fabric_device_memory_resident_bytes", **DEVICE) == held + pool
        assert value(during, "fabric_device_queued_messages", **DEVICE) == 0
        assert value(during, "fabric_worker_memory_budget_bytes", worker="worker-0") > held
    after = scrape_until(url, lambda s: value(s, "fabric_device_memory_resident_bytes",
                                              **DEVICE)
                         == value(s, "fabric_device_shared_memory_pool_bytes", **DEVICE),
                         "device 0's memory released")
    assert moved(after, "fabric_device_ops_total") == expected_ops  # a close runs no op
    assert moved(after, "fabric_device_graph_replays_total") == 2  # kept past the session


def test_labels_are_device_and_worker_only(metered):
    samples = scrape_until(metered.metrics_url, lambda s: ("fabric_device_ops_total",
                                                           frozenset(DEVICE.items())) in s,
                           "device 0's figures")
    reported = [labels for (name, labels) in samples if name.startswith((
        "fabric_device_op", "fabric_device_memory", "fabric_device_graph",
        "fabric_device_queued", "fabric_worker_memory"))]
    assert reported
    assert {key for labels in reported for key, _ in labels} <= {"device", "worker", "le"}


BULK = [0] * 5  # a device report's shared-memory counts and pool bytes
LINKS = [0] * len(LinkReport._fields)


def device(resident=0, buckets=None, seconds=0.0, replays=0, registrations=0, queued=0,
           bulk=BULK) -> list:
    """A device report as a HEARTBEAT carries it (any field may be given wrong)."""
    return [resident, [0] * BUCKETS if buckets is None else buckets, seconds, replays,
            registrations, queued, *bulk]


BAD_REPORTS = {
    "not a list": {"report": {"devices": []}},
    "no devices list": {"report": [None, 7, 0, LINKS, []]},
    "no link_refusals": {"report": [None, [device()]]},
    "negative link_refusals": {"report": [None, [device()], -1, LINKS, []]},
    "no links": {"report": [None, [device()], 0]},
    "a link count short": {"report": [None, [device()], 0, LINKS[1:], []]},
    "a negative link count": {"report": [None, [device()], 0, [-1, *LINKS[1:]], []]},
    "a device too many": {"report": [None, [device()] * 2, 0, LINKS, []]},
    "a device report short": {"report": [None, [device()[:6]], 0, LINKS, []]},
    "a negative size": {"report": [None, [device(resident=-1)], 0, LINKS, []]},
    "a bool for a count": {"report": [None, [device(replays=True)], 0, LINKS, []]},
    "a negative shared-memory count": {"report": [None, [device(bulk=[0, -8, 0, 0, 0])], 0,
                                                  LINKS, []]},
    "too few buckets": {"report": [None, [device(buckets=[0] * (BUCKETS - 1))], 0, LINKS, []]},
    "a count too large": {"report": [None, [device(buckets=[2**64 - 1] * BUCKETS)], 0, LINKS, []]},
    "seconds not a number": {"report": [None, [device(seconds="1")], 0, LINKS, []]},
    "infinite seconds": {"report": [None, [device(seconds=math.inf)], 0, LINKS, []]},
    "a bad budget": {"report": [-5, [device()], 0, LINKS, []]},
    "no sessions": {"report": [None, [device()], 0, LINKS]},
    "sessions not a list": {"report": [None, [device()], 0, LINKS, {}]},
    "a session report short": {"report": [None, [device()], 0, LINKS, [[1, 2]]]},
    "a negative session size": {"report": [None, [device()], 0, LINKS, [[1, -2, 3]]]},
    "a session id not an int": {"report": [None, [device()], 0, LINKS, [[True, 2, 3]]]},
    "too many sessions": {"report": [None, [device()], 0, LINKS,
                                     [[1, 2, 3]] * (MAX_REPORTED_SESSIONS + 1)]},
}


def test_a_malformed_report_is_a_counted_protocol_error_and_the_broker_keeps_serving(metered):
    url = metered.metrics_url
    errors = value(scrape(url), "fabric_broker_events_total", event="workers_protocol_errors")
    good = WorkerReport(1 << 30, (DeviceReport(4096, (1, 2) + (0,) * (BUCKETS - 3) + (3,), 1.5,
                                               7, 2, 5, 3, 300, 2, 200, 1 << 20),),
                        link_refusals=4, links=LinkReport(5, 500, 6, 600, 1))
    with RawDealer(metered.worker_address, metered.worker_token) as raw:
        raw.send(frames_of(Kind.REGISTER, {"token": metered.worker_token, "name": "raw",
                                           "backend": "numpy", "devices": [{}]}, request=1))
        assert raw.recv_message(5).kind is Kind.REGISTERED
        for case, body in BAD_REPORTS.items():
            raw.send(frames_of(Kind.HEARTBEAT, body))
            # (the broker's own heartbeats to its registered worker may come first)
            answer = raw.recv_until(lambda m: m.kind is not Kind.HEARTBEAT, 5)
            assert answer.kind is Kind.ERROR, case
            assert error_from_wire(answer.body).code == ProtocolError.code, case
        raw.send_message(Message(Kind.HEARTBEAT, body=report_body(good)))
        labels = {"device": "1", "worker": "raw"}
        samples = scrape_until(url, lambda s: value(s, "fabric_device_ops_total", **labels),
                               "the raw worker's figures")
        assert value(samples, "fabric_broker_events_total", event="workers_protocol_errors") \
            == errors + len(BAD_REPORTS)
        assert value(samples, "fabric_device_ops_total", **labels) == 6
        assert histogram(samples, **labels) == [1, 3, 3] + [3] * (BUCKETS - 4) + [6]
        assert value(samples, "fabric_device_op_seconds_sum", **labels) == 1.5
        assert value(samples, "fabric_device_memory_resident_bytes", **labels) == 4096
        assert value(samples, "fabric_device_graph_replays_total", **labels) == 7
        assert value(samples, "fabric_device_graph_registrations_total", **labels) == 2
        assert value(samples, "fabric_device_queued_messages", **labels) == 5
        assert value(samples, "fabric_worker_memory_budget_bytes", worker="raw") == 1 << 30
        assert value(samples, "fabric_worker_link_refusals_total", worker="raw") == 4
        for direction, count, size in (("to_device", 3, 300), ("to_client", 2, 200)):
            assert value(samples, "fabric_device_shared_memory_transfers_total", **labels,
                         direction=direction) == count
            assert value(samples, "fabric_device_shared_memory_bytes_total", **labels,
                         direction=direction) == size
        assert value(samples, "fabric_device_shared_memory_pool_bytes", **labels) == 1 << 20
        for direction, count, size in (("sent", 5, 500), ("received", 6, 600)):
            assert value(samples, "fabric_worker_link_transfers_total", worker="raw",
                         direction=direction) == count
            assert value(samples, "fabric_worker_link_bytes_total", worker="raw",
                         direction=direction) == size
        assert value(samples, "fabric_worker_link_fallbacks_total", worker="raw") == 1
    assert metered.broker.poll() is None, metered.log_tail("broker", 20)
    with metered.connect(device=0) as session:
        assert session.asarray([1.0, 2.0]).sum().numpy() == 3.0


# -- sans I/O -------------------------------------------------------------------------------


def test_a_report_goes_through_its_codec_unchanged():
    report = WorkerReport(None, (DeviceReport(10, (0,) * BUCKETS, 0.0, 0, 0, 0),
                                 DeviceReport(2**40, tuple(range(BUCKETS)), 12.5, 3, 1, 9,
                                              4, 2**33, 5, 2**34, 2**31)), 7,
                          LinkReport(1, 2**30, 2, 2**31, 3),
                          (SessionReport(5, 2**40, 12), SessionReport(2**64 - 1, 0, 0)))
    body = protocol.decode(protocol.encode(Message(Kind.HEARTBEAT, body=report_body(report))))
    assert decode_report(body.body, devices=2) == report
    assert decode_report({}, devices=2) is None  # a lane's heartbeat says nothing of it
    with pytest.raises(ProtocolError, match="one per device"):
        decode_report(body.body, devices=3)


@pytest.mark.parametrize("case", BAD_REPORTS)
def test_each_malformed_report_is_a_protocol_error(case):
    with pytest.raises(ProtocolError):
        decode_report(BAD_REPORTS[case], devices=1)


def test_a_batch_s_ops_are_counted_at_its_time_per_op():
    tally = DeviceTally()
    tally.ran(4, 4 * 5e-5)  # 50 µs per op: in the bucket up to 1e-4 s
    tally.ran(1, 30.0)  # past the largest bound: +Inf
    tally.ran(0, 1.0)  # a batch of frees only: no op, no time
    report = tally.report(resident_bytes=8, queued=1)
    assert report.ops == 5 and report.op_seconds == pytest.approx(4 * 5e-5 + 30.0)
    assert report.op_buckets[OP_SECONDS_BUCKETS.index(1e-4)] == 4
    assert report.op_buckets[-1] == 1 and sum(report.op_buckets) == 5


def test_the_registry_keeps_a_worker_s_last_good_report_and_counts_bad_ones():
    registry = busy_registry()  # worker A: device 0 (one device)
    report = WorkerReport(100, (DeviceReport(64, (2,) + (0,) * (BUCKETS - 1), 1e-6, 0, 0, 0),))
    assert registry.from_worker(A, frames(Kind.HEARTBEAT, 0, 0, report_body(report)), 2.0) == []
    sends = registry.from_worker(A, frames(Kind.HEARTBEAT, 0, 0, BAD_REPORTS["not a list"]), 2.1)
    assert [protocol.decode(s.frames).kind for s in sends] == [Kind.ERROR]
    assert registry.counters["workers_protocol_errors"] == 1
    registry.from_worker(A, frames(Kind.HEARTBEAT, 0, 0, {}), 2.2)  # a lane's: says nothing
    samples = {(s.name, frozenset(s.labels.items())): s.value
               for family in families(figures(registry, 3.0, held=0)) for s in family.samples}
    worker_a = {"device": "0", "worker": "a"}
    assert samples["fabric_device_ops_total", frozenset(worker_a.items())] == 2
    assert samples["fabric_device_memory_resident_bytes", frozenset(worker_a.items())] == 64
    assert samples["fabric_device_op_seconds_bucket",
                   frozenset({**worker_a, "le": "1e-06"}.items())] == 2
    assert samples["fabric_worker_memory_budget_bytes", frozenset({"worker": "a"}.items())] == 100
    # Worker b said nothing yet: none of its devices has reported figures.
    assert not [key for key in samples if key[0] == "fabric_device_ops_total"
                and ("worker", "b") in key[1]]


def test_a_name_back_with_fewer_devices_reports_only_those():
    registry = make_registry((A, "a", 2))  # device indexes 0 and 1
    registry.unroutable(Side.WORKERS, A, 1.0)  # lost: its indexes are kept for its name
    assert kinds(registry.from_worker(B, register_frames("a", [{}]), 2.0)) == [Kind.REGISTERED]
    report = WorkerReport(None, (DeviceReport(8, (0,) * BUCKETS, 0.0, 0, 0, 0),))
    assert registry.from_worker(B, frames(Kind.HEARTBEAT, 0, 0, report_body(report)), 2.1) == []
    rows = {row["index"]: row for row in admin_devices(registry, 3.0)["devices"]}
    assert (rows[0]["resident_bytes"], rows[1]["resident_bytes"]) == (8, None)
    samples = {(s.name, frozenset(s.labels.items())) for family in
               families(figures(registry, 3.0, held=0)) for s in family.samples}
    assert ("fabric_device_ops_total", frozenset({"device": "0", "worker": "a"}.items())) \
        in samples
    assert ("fabric_device_ops_total", frozenset({"device": "1", "worker": "a"}.items())) \
        not in samples


def test_a_heartbeat_stays_small_whatever_the_counts():
    most = 2**63 - 1
    largest = DeviceReport(most, (most,) + (0,) * (BUCKETS - 1), 1e300, *[most] * 8)
    for devices in (1, 8):
        report = WorkerReport(most, (largest,) * devices, most, LinkReport(*[most] * 5))
        size = sum(map(len, protocol.encode(Message(Kind.HEARTBEAT, body=report_body(report)))))
        assert size < 150 + 150 * devices  # (every count at its largest: 9 bytes each)
        assert decode_report(protocol.decode(protocol.encode(Message(
            Kind.HEARTBEAT, body=report_body(report)))).body, devices) == report
    # and the most sessions it may name add at most 28 bytes each
    report = WorkerReport(None, (largest,), sessions=(SessionReport(2**64 - 1, most, most),)
                          * MAX_REPORTED_SESSIONS)
    size = sum(map(len, protocol.encode(Message(Kind.HEARTBEAT, body=report_body(report)))))
    assert size < 300 + 28 * MAX_REPORTED_SESSIONS
