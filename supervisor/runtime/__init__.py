"""The Trio side of a session: the actor that runs the core's decisions, and its plumbing.

- :mod:`~supervisor.runtime.session`: :class:`Session`, the actor (mailbox, inbox, child
  tasks) around the pure :class:`~supervisor.core.session.SessionCore`.
- :mod:`~supervisor.runtime.fanout`: a session's history and its subscribers.
- :mod:`~supervisor.runtime.alarm`: one clock task that wakes every actor at its deadline.
- :mod:`~supervisor.runtime.ingest`: how much agent output all sessions handle per pass.
- :mod:`~supervisor.runtime.reply`: the one-shot answer slot of a mailbox call.
"""
