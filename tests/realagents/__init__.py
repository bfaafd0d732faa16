"""Tier 4 support: the real agent CLIs, installed from npm, against a fake model on loopback.

Modules:

- ``install.py``: pinned npm installs into ``.cache/npm-agents/<key>@<version>/`` (git-ignored),
  once, reused; native binaries resolved; skips (failures under strict mode) when impossible.
- ``fake_model.py``: a stdlib HTTP server speaking the four model APIs the agents call, scripted
  by the newest user text, logging every request and the moment a client hangs up.
- ``fake_amp.py``: a stand-in for Amp's *server* (Amp's CLI calls no model: its agent loop runs
  server-side behind two JSON-RPC WebSockets), scripted the same way, logging every turn.
- ``netns.py``: the loopback-only network namespace (below).
- ``agents.py``: per agent, the fresh HOME/XDG folders, config files and environment that point
  it at the fake model with nothing else reachable, and its :class:`supervisor.AgentSpec`.
- ``conftest.py``: fixtures, the skip/strict policy, the latency table at the end of a run.
- ``scenarios.py``, ``steering.py``: the steps the ``tests/real/`` modules share (the
  cancel scenarios; ``session.steer`` and the model request that carries the steer).
- ``tee.py``: optional wire log of everything between the supervisor and an agent
  (``AGENT_TIER4_TEE=1``).

Isolation: how the agent and the fake model meet inside one namespace
----------------------------------------------------------------------
Each test gets its own network namespace that has only ``lo``, so whatever an agent tries to
reach besides the fake model (OpenCode looks up the npm registry, Claude's CLI its vendor's API,
Gemini its update server) fails at once and nothing leaves the machine.

The catch is that a server in the host's namespace is not reachable from inside, and the fake
model must run in the test process (so a test can read its log and wait on it without files or
polling). The design that makes both true:

1. a tiny *holder* process is started under ``unshare -n`` (as root; ``unshare -rn`` otherwise,
   which adds a user namespace). It brings ``lo`` up with an ioctl (no dependency on ``ip``),
   creates a listening TCP socket on 127.0.0.1 and hands the socket back to the test process over
   a Unix socket pair (SCM_RIGHTS). A socket stays in the namespace it was created in, whichever
   process holds it;
2. the test's :class:`FakeModel` serves on that socket, in a thread of the test process;
3. the agent's command is wrapped as ``nsenter --net=/proc/<holder>/ns/net -- CMD...``
   (``nsenter -U -n --preserve-credentials -t <holder>`` with a user namespace). ``nsenter``
   execs, so the agent is the shim's child as usual and the supervisor's tree kill and psutil
   checks see it (the PID namespace is the host's). A respawned agent joins the same namespace
   and finds the same port;
4. closing the socket pair ends the holder, and with it the namespace.

Where no namespace can be made (no util-linux, no privileges, ``AGENT_TIER4_NETNS=none``) the
agents run in the host's namespace against a model on the host's 127.0.0.1; the run's summary
says so. Measured here (2 cores, root): making the namespace costs ~30 ms per test.
"""
