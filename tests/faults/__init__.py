"""The fault and load suite: every protocol under every fault, cancel storms, supervisor crashes.

- ``test_fault_matrix.py``: protocol x fault, real subprocesses (agents in ``agents.py``);
- ``test_cancel_storm.py``: 100 sessions, random prompts and cancels, nothing lost or leaked;
- ``test_supervisor_crash.py``: a supervisor killed with SIGKILL mid-turn (and its shim too);
- ``test_cancel_edges.py``: cancels of queued, dropped and failed turns, a stop during a cancel,
  a respawn that cannot resume (the supervisor bugs the suite found were fixed with it).

Default mode: about a minute on two cores. ``AGENT_SUPERVISOR_LONG_FAULTS=1``: the long mode
(every matrix cell three times; the storm with real demo-agent subprocesses, for a minute).
"""
