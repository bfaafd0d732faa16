"""The gateway's bounds (``design/gateway.md``, "Limits, and what each protects"), and one
connection's place among ``max_connections``."""

from __future__ import annotations

from typing import Final

import trio
from attrs import define, field

from supervisor.wire.requests import HARD_FRAME_BYTES

__all__ = ["LIMITS", "GatewayLimits", "Slot"]


@define
class GatewayLimits:
    """Per-server bounds, each a guard against one runaway client (``design/gateway.md``,
    "Limits", says what each protects)."""

    #: TCP connections at once. When full, a new one takes the place of the oldest that has
    #: not shown the token yet, else of the oldest idle keep-alive; one serving a request or a
    #: WebSocket is never closed for it (then the new one gets 503).
    max_connections: int = 256
    #: requests a connection may have in flight (a cancel waits for the turn to end)
    max_pending: int = 64
    #: responses queued for one client's socket before its requests are no longer read
    outgoing_buffer: int = 1024
    #: the same in bytes: an answer may be a megabyte (a diff is up to 256 KiB, an error echoes
    #: a session id or action name of up to a frame), and 1024 of those unread is a gigabyte.
    #: Past it, requests are no longer read; the ``max_pending`` requests already running may
    #: still add their answers.
    outgoing_bytes: int = 4 * 1024 * 1024
    #: events a subscription may fall behind before it holds the agent back (see stall)
    subscription_buffer: int = 4096
    #: a subscriber whose buffer is full holds the session's agent back (its output is not
    #: read) rather than being cut off and losing what the history no longer holds; one that
    #: takes nothing at all for this long is cut off (``subscription.lagged``, then since_seq).
    #: So a stalled client delays the others by at most this much, once per stall.
    subscriber_stall_s: float = 5.0
    #: events taken from one subscription for one socket write (several frames, one write)
    batch_events: int = 256
    #: events of all subscriptions in one socket write (beyond a response's own barrier): a
    #: connection subscribed to many flooding sessions writes in bounded pieces, so a response
    #: queued meanwhile waits behind one piece, not one batch of every subscription;
    #: subscriptions take turns being first
    write_events: int = 1024
    #: flow control above TCP (None: off): at most about this many bytes of events written and
    #: not yet read by the client. The writer pings after each quarter of it, and while four
    #: pings are unanswered (a client answers a ping once it has read what came before) it
    #: writes only answers to requests (and the events their barriers need), no more events. For
    #: a node's gateway, whose one client (a front's link) sits behind pipes and an SSH
    #: channel that buffer megabytes TCP knows nothing of: without it a quiet session's
    #: receipt queues behind all of that (``design/remote.md``, "Flow control")
    flight_bytes: int | None = None
    #: the transport's hard frame limit; frames between MAX_FRAME_BYTES and this get too_large
    hard_frame_bytes: int = HARD_FRAME_BYTES
    #: an HTTP request head (nginx's default in all), and a body for the small API. h11 parses
    #: a head whole before its token is checked, in time that grows with its bytes
    max_head_bytes: int = 32 * 1024
    #: lines of an HTTP request head (Apache's ``LimitRequestFields``). A head is parsed whole
    #: before its token can be checked, on the one thread every session shares, and 64 KiB of
    #: short header lines cost milliseconds: a few hundred such heads released at once held
    #: everyone's requests, cancels too, for seconds. Counted as the bytes come, before h11
    #: parses them; a head with more is refused (431) unparsed.
    max_head_fields: int = 100
    max_body_bytes: int = 64 * 1024
    #: from the moment a connection waits for a request (it opened, or had its last answer)
    #: until that request's head and body are all in, TLS handshake included: a client that
    #: sends slowly (slowloris), or a head and then no body, holds its slot this long at most.
    #: The same bound applies to writing an HTTP answer to a client that reads nothing.
    request_timeout_s: float = 10.0
    #: kernel send buffer per connection (None: the OS autotunes, up to several MB); a
    #: smaller one bounds memory per client and makes a stalled reader felt sooner
    send_buffer_bytes: int | None = None


LIMITS: Final = GatewayLimits()


@define(eq=False)
class Slot:
    """One TCP connection's place among ``max_connections``: what admission may close to make
    room (``Gateway``), and how far the connection got (its HTTP side says)."""

    scope: trio.CancelScope = field(factory=trio.CancelScope)
    #: ``new`` (no request has shown the token yet), ``busy`` (serving an authenticated
    #: request, or a WebSocket) or ``idle`` (an authenticated keep-alive between requests)
    state: str = "new"
