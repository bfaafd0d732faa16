"""The session core: every decision about a session, in code that never waits (no trio, no I/O).

The Trio shell around it is ``supervisor/runtime/``; ``design/actor.md`` describes both.
"""
