"""Ports handed to children are not handed out twice by one process (the console suite
once started a bookie on a port an earlier pick had already given to another)."""

from __future__ import annotations

import socket

from scriba.embedded.process import _ephemeral_port_min, free_port, free_ports


def test_ports_are_never_handed_out_twice_in_a_row_of_picks() -> None:
    # 3,000 random picks from ~22,000 ports would repeat ~200 times by the birthday bound.
    picked = [free_port() for _ in range(1_500)] + [p for _ in range(500) for p in free_ports(3)]
    assert len(picked) == len(set(picked))


def test_ports_lie_below_the_ephemeral_range_and_are_bindable() -> None:
    ports = free_ports(4)
    assert len(set(ports)) == 4
    assert all(p < _ephemeral_port_min() for p in ports)
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))
