"""Shared pytest setup: fixtures live in the shipped test kit (``scriba.testing``)."""

from scriba.grpc_runtime import apply_defaults

apply_defaults()  # tests run gRPC the way the scriba commands do (before anything imports it)

pytest_plugins = ["scriba.testing.fixtures"]
