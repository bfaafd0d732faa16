"""Agent processes and their containment: everything that touches the operating system.

- :mod:`~supervisor.agents.link`: what a session sees of a running agent (``AgentLink``) and
  how one is started (``Launcher``).
- :mod:`~supervisor.agents.process_link`, :mod:`~supervisor.agents.http_link`: the links of an
  agent on stdio and of an agent that is a local HTTP server.
- :mod:`~supervisor.agents.process`: one OS process and its tree, the kill ladder.
- :mod:`~supervisor.agents.containment`, :mod:`~supervisor.agents.cgroups`,
  :mod:`~supervisor.agents.shim`, :mod:`~supervisor.agents.cgroup_keeper`,
  :mod:`~supervisor.agents.tree`: what keeps a tree together and finds it when that fails.
- :mod:`~supervisor.agents.statefile`: the state file that lets the next supervisor kill what
  a crashed one left.

``shim.py`` and ``cgroup_keeper.py`` are scripts started by path with ``python -S -E -P``:
they import nothing but the standard library.
"""
