"""What the broker answers for a message past a size limit, sans I/O.

Rule: libzmq bounds each frame (MAXMSGSIZE) and holds a multipart message whole before the
broker sees it; these checks bound the rest (``fabric.core.flow``: a message's frame count and
total bytes) as soon as a message is in, and the sender learns why in a typed error
(``MessageTooLarge``) instead of a silent drop. A TRANSFER bigger than its destination worker
takes arrives there as that error in place of the tensor.
"""

from __future__ import annotations

from typing import Any, Sequence

from fabric.core import protocol
from fabric.core.errors import MessageTooLarge, ProtocolError
from fabric.core.flow import MAX_MESSAGE_FRAMES, largest_frame, size_and_limit_text
from fabric.core.protocol import Header, Kind, Message

from .model import Send, Side, Worker, send_error, send_message


def frames_size(frames: Sequence[Any]) -> int:
    """A message's bytes, in all its frames."""
    return sum(map(len, frames))


def message_too_large(side: Side, identity: bytes, header: Header, frames: Sequence[Any],
                      size: int, limit: int) -> list[Send]:
    """The answer to a message with more than MAX_MESSAGE_FRAMES frames or ``limit`` bytes
    (``size``): dropped, and its sender told, on the request it made."""
    if len(frames) > MAX_MESSAGE_FRAMES:
        what = f"has {len(frames)} frames, more than the {MAX_MESSAGE_FRAMES} one takes"
    else:
        size_words, limit_words = size_and_limit_text(size, limit)
        what = f"is {size_words}, more than the {limit_words} one takes"
    error = MessageTooLarge(
        f"A {header.kind.name} message {what}: fabric's client never sends such a message; "
        "send fewer or smaller arrays at a time.", size=size, limit=limit)
    return [send_error(side, identity, error, session=header.session, request=header.request)]


def transfer_too_large(destination: Worker, lane: bytes, header: Header,
                       frames: Sequence[Any]) -> list[Send]:
    """A TRANSFER bigger than its destination worker takes: the tensor arrives as the error
    instead (the body is decoded only on this rare path)."""
    try:
        ticket = protocol.decode(frames, header).body.get("ticket")
    except ProtocolError:
        return []
    size, limit = largest_frame(frames), destination.max_message_bytes
    size_words, limit_words = size_and_limit_text(size, limit)
    error = MessageTooLarge(
        f"The tensor moved with .to() is {size_words}, more than the {limit_words} "
        f"worker {destination.name} takes in one message: move it in slices, or start "
        "that worker with a larger --max-message-bytes.", size=size, limit=limit)
    return [send_message(Side.WORKERS, lane, Message(
        Kind.TRANSFER, header.session, header.request,
        {"ticket": ticket, "error": error.to_wire()}))]
