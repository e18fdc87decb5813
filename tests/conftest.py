"""Shared pytest setup: fixtures live in the shipped test kit (``scriba.testing``)."""
