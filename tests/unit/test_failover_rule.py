"""Which broker of a pair a client ends on (``fabric.transport.failover``), with a fake attempt:
what moves it on, what is the answer, and how it fails."""

from __future__ import annotations

from typing import Callable

import pytest

from fabric.transport.failover import broker_list, first_active
from fabric.core.errors import (AuthenticationError, BrokerPassive, ConnectError, DeviceOffline,
                                NoActiveBroker, ServerDisconnected, WrongPort)

pytestmark = pytest.mark.timeout(30)

A, B = "tcp://a:5555", "tcp://b:5555"


def scripted(answers: dict[str, list]) -> tuple[list, Callable[[str, float], object]]:
    """An attempt that answers each address from its list in turn (an error is raised), and
    the (address, seconds) it was called with."""
    calls = []

    def attempt(address: str, seconds: float):
        calls.append((address, seconds))
        answer = answers[address].pop(0) if len(answers[address]) > 1 else answers[address][0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return calls, attempt


def test_a_passive_broker_moves_the_client_on_to_the_active_one():
    calls, attempt = scripted({A: [BrokerPassive("passive")], B: ["session"]})
    assert first_active([A, B], 10.0, attempt) == "session"
    assert [address for address, _ in calls] == [A, B]
    assert all(seconds <= 5.0 for _, seconds in calls)  # (each its share of the timeout)


def test_a_takeover_under_way_is_waited_for_until_it_serves():
    settling = DeviceOffline("offline", settling=True)
    calls, attempt = scripted({A: [ConnectError("nothing listening")],
                               B: [BrokerPassive("passive"), settling, "session"]})
    assert first_active([A, B], 10.0, attempt) == "session"
    assert [address for address, _ in calls] == [A, B, A, B, A, B]


@pytest.mark.parametrize("answer", [AuthenticationError("token"), WrongPort("port"),
                                    DeviceOffline("offline")])
def test_any_other_refusal_is_the_answer(answer):
    _, attempt = scripted({A: [answer], B: ["session"]})
    with pytest.raises(type(answer)):
        first_active([A, B], 10.0, attempt)


def test_neither_answering_fails_at_once_naming_both():
    calls, attempt = scripted({A: [ConnectError("nothing listening")],
                               B: [ServerDisconnected("closed")]})
    with pytest.raises(NoActiveBroker) as failed:
        first_active([A, B], 10.0, attempt)
    assert A in failed.value.message and B in failed.value.message
    assert failed.value.details["said"] == {A: "connect_failed", B: "server_disconnected"}
    assert len(calls) == 2


def test_passive_brokers_past_the_timeout_fail_naming_both():
    _, attempt = scripted({A: [BrokerPassive("passive")], B: [BrokerPassive("passive")]})
    with pytest.raises(NoActiveBroker, match="None of the brokers"):
        first_active([A, B], 0.5, attempt)


def test_one_broker_is_simply_attempted():
    _, attempt = scripted({A: [ConnectError("nothing listening")]})
    with pytest.raises(ConnectError) as failed:
        first_active([A], 10.0, attempt)
    assert type(failed.value) is ConnectError


def test_an_address_may_list_several_brokers():
    assert broker_list(f"{A}, {B}") == [A, B]
    assert broker_list(A) == [A]


def test_an_admin_asks_one_broker_of_a_pair_at_a_time():
    from fabric.client.admin import Admin
    from fabric.core.errors import ConfigError

    with pytest.raises(ConfigError, match="fabric admin pair asks each broker"):
        Admin(f"{A},{B}", token="admin-token")
