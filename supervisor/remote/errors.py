"""What can go wrong with a remote host, each error naming its cause."""

from __future__ import annotations

from typing import ClassVar

from supervisor.errors import SupervisorError

__all__ = ["HostCapacity", "HostUnreachable", "LinkLost", "NodeRetired"]


class HostUnreachable(SupervisorError):
    """The host's node could not be reached; ``cause`` says why, in one stable word:
    ``host_key_mismatch``, ``auth_refused``, ``not_installed``, ``version_mismatch``,
    ``transport_failed`` (the transport exited: its own words are in the message),
    ``timeout`` (no answer within ``connect_timeout_s``) or ``node_failed`` (the node did
    not start)."""

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
