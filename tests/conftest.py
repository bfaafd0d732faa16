"""Shared fixtures: nothing global; see tests/helpers.py for the event recorder."""

from __future__ import annotations

import os
import sys

# Tests import the fakes as a package (tests/fakes/...).
sys.path.insert(0, os.path.dirname(__file__))
