"""Scriba's web console: see the cluster — zones, bookies, ledgers' placement, streams,
RSM groups and recovery — in a browser, and the same as JSON under ``/api/``.

    scriba console --metadata etcd://127.0.0.1:2379/scriba --listen 127.0.0.1:8080

Theory of operation: a :class:`~scriba.console.mirror.Mirror` keeps a copy of the
metadata the console shows by watching the store (never a read per page view); a
:class:`~scriba.console.probe.Prober` asks every bookie's ``/health`` and ``/metrics``
each second and keeps a bounded window of samples; a
:class:`~scriba.console.rsm_probe.RsmProber` asks every registered RSM replica for its
live STATUS; a :class:`~scriba.console.geo_lag.GeoScraper` keeps a bounded window of the
geo replicators' lag (``--geo-metrics``); :class:`~scriba.console.views.Model`
turns them into JSON-ready dicts (no I/O); :mod:`~scriba.console.server` serves them
as ``/api/...`` and as pages rendered server-side with Jinja2, pictures drawn as SVG
by :mod:`~scriba.console.svg`. A few lines of plain JavaScript (``static/console.js``)
re-fetch the page's fragment every two seconds, so a killed bookie turns "down"
without a reload. Read-only unless started with ``--allow-actions``: then decommission,
audit and leadership transfer, each confirmed (:mod:`~scriba.console.actions`).

The console reads every layer and no layer imports it (tests/test_layers.py).
"""
