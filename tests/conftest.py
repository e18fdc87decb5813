"""Shared pytest setup: fixtures live in the shipped test kit (``scriba.testing``)."""

pytest_plugins = ["scriba.testing.fixtures"]
