"""The node side of remote hosts: ``agent-supervisor node`` and its bridge.

- :mod:`~supervisor.node.daemon`: the daemon that owns one host's sessions, behind the
  gateway's wire protocol on a Unix socket.
- :mod:`~supervisor.node.bridge`: ``node --bridge``, what a front's transport runs: it starts
  the node if need be and relays its stdio to it (standard library only: it starts fast, so
  this package imports nothing).
"""
