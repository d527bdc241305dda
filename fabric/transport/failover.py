"""Opening a session on a broker pair: the client tries each listed broker until the active
one welcomes it.

Rule: a broker that says it is passive (``BrokerPassive``), that is settling after a takeover
(a device refusal marked ``settling``: its workers are still registering), or that does not
answer (nothing listening, closed before WELCOME, no answer in time) leaves the client to try
the next; any other refusal (a token, a version, a device that does not exist) is the answer
and is raised at once. When every broker of a round is unreachable the client fails at once
with ``NoActiveBroker``; while one of them is passive or settling (a takeover under way), it
tries again until ``timeout``. Every attempt has a deadline within the caller's, and none
takes more than its share of ``timeout``, so a broker that hangs leaves time for the other.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence, TypeVar

from fabric.core.errors import (BrokerPassive, ConnectError, EncryptionError, FabricError,
                                HandshakeTimeout, NoActiveBroker, ServerDisconnected, WrongPort)

T = TypeVar("T")

_ROUND_PAUSE = 0.2  # seconds between rounds while a broker of the pair is passive or settling


def broker_list(address: str) -> list[str]:
    """The brokers an address names: one, or a pair's separated by a comma."""
    return [part.strip() for part in address.split(",") if part.strip()]


def _waits_for_a_takeover(error: FabricError) -> bool:
    """Whether ``error`` comes from a live broker that may serve soon (try again later)."""
    return isinstance(error, BrokerPassive) or bool(error.details.get("settling"))


def _unreachable(error: FabricError) -> bool:
    """Whether ``error`` says nothing answered at the address (try the next at once)."""
    if isinstance(error, (ServerDisconnected, HandshakeTimeout)):
        return True
    return type(error) is ConnectError  # nothing listening, or no fabric broker there


def first_active(addresses: Sequence[str], timeout: float,
                 attempt: Callable[[str, float], T]) -> T:
    """``attempt(address, seconds)`` at each of ``addresses`` in turn until one succeeds; see
    the module's rule for which failures move on. Raises NoActiveBroker naming each address
    and what it said when none serves within ``timeout`` (at once when none answers). A
    single address is simply attempted: its error is the answer."""
    if len(addresses) == 1:
        return attempt(addresses[0], timeout)
    deadline = time.monotonic() + timeout
    said: dict[str, FabricError] = {}
    while True:
        for address in addresses:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _none_serves(addresses, said, timeout)
            try:  # (a broker that hangs leaves time for the other)
                return attempt(address, min(left, timeout / len(addresses)))
            except (EncryptionError, WrongPort):
                raise
            except ConnectError as exc:
                if not (_waits_for_a_takeover(exc) or _unreachable(exc)):
                    raise  # the answer: a token, a version, a device refused
                said[address] = exc
        if not any(_waits_for_a_takeover(said[address]) for address in addresses):
            raise _none_serves(addresses, said, timeout)
        time.sleep(max(0.0, min(_ROUND_PAUSE, deadline - time.monotonic())))


def _none_serves(addresses: Sequence[str], said: dict[str, FabricError],
                 timeout: float) -> NoActiveBroker:
    words = "; ".join(f"{address}: {said[address].message.rstrip('.')}" if address in said
                      else f"{address}: not tried in time" for address in addresses)
    return NoActiveBroker(
        f"None of the brokers {', '.join(addresses)} serves (after {timeout:g} s at most): "
        f"{words}. Start them (fabric cluster up --standby), or check the addresses.",
        addresses=list(addresses), said={address: error.code for address, error in said.items()})
