"""Replicated state machines on log streams (filled in below)."""
