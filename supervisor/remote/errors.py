"""What can go wrong with a remote host, each error naming its cause."""

from __future__ import annotations

from typing import ClassVar

from supervisor.errors import SupervisorError

__all__ = ["HostCapacity", "HostUnreachable", "LinkLost", "NodeRetired"]


class HostUnreachable(SupervisorError):
    """The host's node could not be reached; ``cause`` says why, in one stable word:
    ``host_key_mismatch``, ``auth_refused``, ``no_container`` (docker/kubectl: no such
    container or pod, or it is not running), ``not_installed``, ``version_mismatch``,
    ``transport_failed`` (the transport exited: its own words are in the message),
    ``timeout`` (no answer within ``connect_timeout_s``, or to a request within its deadline:
    ``request_timeout_s`` and what the agent may take), ``node_failed`` (the node did not
    start) or ``protocol_error`` (the node sent what is not the protocol: a frame that is not
    a JSON object, too deep or too large, an answer without what its action gives, a WebSocket
    handshake that is not one; the link to it is given up and its sessions there fail)."""

    code: ClassVar[str] = "host_unreachable"

    def __init__(self, host: str, cause: str, message: str) -> None:
        super().__init__(f"host {host}: {message}")
        self.host = host
        self.cause = cause


class HostCapacity(SupervisorError):
    """Every host the agent may run on holds its ``max_sessions``."""

    code: ClassVar[str] = "capacity"


class LinkLost(SupervisorError):
    """The link to the node dropped while a request was in flight: whether the node acted
    on it is unknown (a cancel is sent again once the link is back)."""

    code: ClassVar[str] = "host_unreachable"


class NodeRetired(SupervisorError):
    """The node was retired (a bridge of a newer package started one beside it): it serves the
    sessions it has, and the front starts new ones on the host's current node."""

    code: ClassVar[str] = "node_retired"
