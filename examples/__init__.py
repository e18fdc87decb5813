"""Example applications built on Scriba's public API (installed as ``scriba.examples``)."""
