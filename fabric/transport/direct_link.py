"""A session's large uploads and reads over a direct link to its worker, not through the
broker (between hosts; on one host, shared memory is the path: ``fabric.transport.bulk``).

Rule: only an array of at least ``DIRECT_BYTES``, of a session that does not share memory
with its worker, asks. The broker grants a link (the worker's bulk endpoint and a one-time
ticket, ``broker.link_grants``); the client connects, showing the ticket (with CURVE as the secret
of its key pair, ``workers.direct_links``), and only once connected, within ``CONNECT_SECONDS``,
does the session's device agree to take the tensor (``expect``, as for ``t.to()``); the
array then travels as a TRANSFER on the link, the worker's word that it took it comes back
there, and the session waits for the device to hold it (``await``), so its later ops find
it. Without a grant or a connection in time, the upload takes the socket path as before, and
the first such fallback to each address is logged; a session refused a link once (its
worker has no endpoint, or is out of reach) asks no more, but one whose broker did not
answer in time (a takeover of a broker pair) asks again at its next large array. A link
that breaks before the worker's word (its connection closes; TCP closes it once its bytes
stall for ``LINK_STALL_SECONDS``) is not waited for: the array goes through the broker
after all, as the very tensor the device expects (a ``put``, which runs before the
``await``), and the first such break to each address is logged. A message cut short on a
link is never delivered, so the device stores the array once.

A read asks for a link the same way. Its tensor is computed first (``shape``, one small round
trip by the broker, which raises the tensor's error as the read would): a read on the link
reaches the device at once, so it must not pass the ops before it. The read then goes on the
link, and its reply comes back on it; where the link breaks first (the worker's side sees
to it when its bytes stall, this side when the pings it sends meanwhile do), the read is sent
again through the broker, and the first such break to each address is logged.
"""

from __future__ import annotations

import logging
import secrets
import weakref
from typing import Any, Callable

import numpy as np
import zmq

from fabric.arrays.origins import issued_at
from fabric.arrays.tensor import Tensor
from fabric.core import protocol
from fabric.core.errors import FabricError, RequestTimeout
from fabric.core.protocol import Kind, Message
from fabric.core.security import show_ticket
from fabric.core.sockets import recv_frames
from fabric.core.wire import device_dtype

log = logging.getLogger("fabric.client")

DIRECT_BYTES = 8 << 20  # an upload or a read this large asks for a direct link
DIRECT_ELEMENTS = DIRECT_BYTES // 16  # reads of fewer elements never do (16: complex128)
CONNECT_SECONDS = 2.0  # the wait for a grant, then for a connection; then the socket path
_told: set[str] = set()  # addresses whose fallback was logged
_told_broken: set[str] = set()  # and whose broken link was
_refused: weakref.WeakSet[Any] = weakref.WeakSet()  # sessions that take the socket path

# (A session is typed Any here: fabric.client.session imports this module.)


def upload(session: Any, array: np.ndarray) -> Tensor | None:
    """``array`` uploaded over a direct link to ``session``'s worker, as a new tensor; None,
    sending nothing of it, where it must take the socket path."""
    if array.nbytes < DIRECT_BYTES or session.shares_memory or session.stream.sinks \
            or array.nbytes > session.max_upload_bytes or session in _refused:
        return None  # (a capture keeps the put to replay; too large: the socket path says so)
    link = _connect(session, array.nbytes)
    if link is None:
        return None
    monitor = link.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    try:
        dtype = device_dtype(array.dtype).newbyteorder("=")
        tensor = session.stream.new_tensor(array.shape, dtype, issued_at())
        ticket = secrets.randbits(63)
        session._call({"op": "expect", "id": tensor.id, "ticket": ticket})
        values = np.ascontiguousarray(array, dtype=dtype)  # (a copy only where it must)
        link.send_multipart(protocol.encode(Message(
            Kind.TRANSFER, session.id, session.id,
            {"ticket": ticket, "dtype": dtype.str, "shape": list(array.shape)},
            (values.reshape(-1).view(np.uint8),))), copy=False)
        taken = _answered(link, monitor, session.timeout)  # (the worker's word, or a break)
        if taken is None:
            raise RequestTimeout(
                f"An upload over the direct link to device {session.device.index} was not "
                f"taken in {session.timeout:g} s: the worker is busy or gone. Upload again "
                "(it takes the broker if no link is made), or raise timeout=.")
        if not taken:
            _say_broken(link, "the worker took the upload")
            session._put(tensor, values)
        session._call({"op": "await", "id": tensor.id})
    finally:
        _close(link, monitor)
    return tensor


def _answered(link: zmq.Socket, monitor: zmq.Socket, seconds: float) -> bool | None:
    """True once ``link`` has a message, False once it broke (its ``monitor`` says it
    disconnected), None where neither comes within ``seconds``."""
    poller = zmq.Poller()
    for sock in (link, monitor):
        poller.register(sock, zmq.POLLIN)
    ready = dict(poller.poll(int(seconds * 1000)))
    return True if link in ready else False if monitor in ready else None


def _say_broken(link: zmq.Socket, before: str) -> None:
    """Log, once per address, that ``link`` broke ``before`` what."""
    address = link.getsockopt(zmq.LAST_ENDPOINT).decode()
    if address not in _told_broken:
        _told_broken.add(address)
        log.warning("the direct link to %s broke before %s: sent again through the broker "
                    "(so are the next that break there)", address, before)


def _close(link: zmq.Socket, monitor: zmq.Socket) -> None:
    """Close ``link`` and its ``monitor`` (``get_monitor_socket``); again: nothing."""
    if not monitor.closed:
        link.disable_monitor()
        monitor.close(linger=0)
    link.close(linger=0)


class LinkRead:
    """A read sent on a direct link (``start_read``), its reply not yet taken; as
    ``fabric.client.session.ReadInFlight``."""

    copy = True  # False: the values come back read-only

    def __init__(self, session: Any, tensor: Tensor, link: zmq.Socket, request: int,
                 body: dict[str, Any],
                 values: Callable[[Message, Tensor], np.ndarray]) -> None:
        self.session, self.tensor, self.request = session, tensor, request
        self._link, self._body, self._values = link, body, values
        self._monitor = link.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    def result(self, timeout: float | None = None) -> np.ndarray:
        """The values, waited for up to ``timeout`` (default: the session's); through the
        broker where the link breaks first."""
        session = self.session
        wait = session.timeout if timeout is None else timeout
        try:
            while True:
                answered = _answered(self._link, self._monitor, wait)
                if answered is None:
                    raise RequestTimeout(
                        f"A read over the direct link to device {session.device.index} "
                        f"got no answer in {wait:g} s: the worker is busy or gone. Read again "
                        "(it takes the broker if no link is made), or raise timeout=.")
                if not answered:
                    _say_broken(self._link, "the read's values came")
                    self.cancel()
                    reply = session._reply(session._send_request(self._body,
                                                                 reads=self.tensor), wait)
                    break
                reply = protocol.decode(recv_frames(self._link))
                if reply.request == self.request:
                    break
        finally:
            self.cancel()
        if "error" in reply.body:
            raise self.session._remote_error(reply.body["error"])
        array = self._values(reply, self.tensor)
        if not self.copy:
            array.flags.writeable = False
        return array

    def cancel(self) -> None:
        """Stop waiting for the values (the link closes)."""
        _close(self._link, self._monitor)


def start_read(session: Any, tensor: Tensor, body: dict[str, Any],
               values: Callable[[Message, Tensor], np.ndarray]) -> LinkRead | None:
    """The read of ``tensor`` (request ``body``), sent on a direct link to ``session``'s
    worker once the tensor is computed; None, sending nothing, where it must take the socket
    path. ``values`` makes the array of its reply."""
    nbytes = tensor.size * tensor.dtype.itemsize
    if nbytes < DIRECT_BYTES or session.shares_memory or session in _refused:
        return None
    link = _connect(session, nbytes)
    if link is None:
        return None
    try:
        session._call({"op": "shape", "id": tensor.id})  # (the read must not pass its ops)
        request = secrets.randbits(63)
        link.send_multipart(protocol.encode(Message(Kind.REQUEST, session.id, request, body)))
    except BaseException:
        link.close(linger=0)
        raise
    return LinkRead(session, tensor, link, request, body, values)


def _connect(session: Any, nbytes: int) -> zmq.Socket | None:
    """A DEALER connected to the bulk endpoint of ``session``'s worker, its handshake done;
    None where the broker grants no link or none is made in time (the session then asks no
    more), or the broker does not answer in time (a takeover, say: it asks again later)."""
    connection = session.connection
    try:
        grant = connection.request(Message(Kind.LINK, session.id, 0, {
            "source": session.id, "nbytes": nbytes}), CONNECT_SECONDS, session=session.id)
    except RequestTimeout:
        return None
    except FabricError:  # (a broker that predates links answers ERROR)
        _refused.add(session)
        return None
    address, ticket, key = (grant.body.get(k) for k in ("address", "ticket", "public_key"))
    if grant.kind != Kind.LINK_GRANT or type(address) is not str \
            or type(ticket) is not bytes or len(ticket) != 32:
        _refused.add(session)
        return None
    link = connection.socket.context.socket(zmq.DEALER)
    show_ticket(link, ticket, key if type(key) is bytes else None)
    # Pings while the link waits for its answer: on a cut link they stall, and TCP closes it
    for option, value in ((zmq.HEARTBEAT_IVL, 1000),
                          (zmq.HEARTBEAT_TIMEOUT, int(session.timeout * 1000))):
        link.setsockopt(option, value)
    link.connect(address)
    if link.poll(int(CONNECT_SECONDS * 1000), zmq.POLLOUT):
        return link
    link.close(linger=0)
    _refused.add(session)
    if address not in _told:
        _told.add(address)
        log.warning("no direct link to %s within %g s: large uploads there travel through "
                    "the broker", address, CONNECT_SECONDS)
    return None
