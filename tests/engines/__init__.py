"""Fake container engines of the project's own, for the real ``docker`` and ``kubectl`` CLIs."""
