"""Scriba: a multi-datacenter replicated-state-machine framework modelled on Apache BookKeeper."""

__version__ = "0.1.0"
