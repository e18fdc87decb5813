"""Geo-replication: cluster-to-cluster stream replication (asynchronous, exactly-once).

    from scriba.geo import Cluster, Replicator
    rep = Replicator(target=Cluster("eu", eu_namespace), stream="orders",
                     sources=[Cluster("us", us_namespace)])
    await rep.run()          # until rep.stop(); restarts itself after any writer or reader error
    rep.lag()                # {"us": Lag(records_behind=..., seconds_behind=...)}

``translate`` maps source positions and cursors into the target (fail-over of consumers);
``drill`` is the fail-over drill (data-loss window, time to writable).

The rules live in I/O-free modules: ``marks`` (the replication headers every shipped
record carries and who may ship what), ``progress`` (where a link resumes, found in the
target stream itself) and ``link`` (one source → target link's state and lag). The
asyncio shell is ``replicator``; ``cli`` adds ``scriba geo replicate``, ``shell`` the
``geo-status`` verb.
"""

from scriba.geo.link import Lag, LinkCore, Ship
from scriba.geo.marks import Mark, origin_of, shippable
from scriba.geo.progress import resume_point
from scriba.geo.replicator import Cluster, Replicator, ReplicatorOptions
from scriba.geo.translate import Translation, translate, translate_cursors

__all__ = [
    "Cluster",
    "Lag",
    "LinkCore",
    "Mark",
    "Replicator",
    "ReplicatorOptions",
    "Ship",
    "Translation",
    "origin_of",
    "resume_point",
    "shippable",
    "translate",
    "translate_cursors",
]
