"""The console's pictures, drawn as SVG text from the views' dicts (no I/O, no templates).

- :func:`cluster_map`: regions -> zones -> racks -> bookies as nested boxes; each
  bookie a ``<g class="bookie" data-bookie=ID data-state=STATE>`` whose colour comes
  from its state (CSS in ``base.html``) and whose ``.b-*`` texts the page's script
  updates in place;
- :func:`ledger_fragments`: one row per fragment, one cell per ensemble slot, each
  bookie coloured by its zone (the legend says which);
- :func:`stream_timeline`: a stream's segments left to right, widths by record count;
- :func:`sparkline`: a polyline of a sample window.

Every text is XML-escaped; sizes are in user units with a ``viewBox`` so the browser
scales them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final
from xml.sax.saxutils import escape, quoteattr

BOOKIE_W: Final = 170
BOOKIE_H: Final = 74
PAD: Final = 10
HEAD: Final = 22
ZONE_COLOURS: Final = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#edc948", "#76b7b2",
                       "#e15759", "#9c755f", "#bab0ac", "#ff9da7")


def zone_colours(zones: Sequence[str]) -> dict[str, str]:
    return {z: ZONE_COLOURS[i % len(ZONE_COLOURS)] for i, z in enumerate(sorted(set(zones)))}


def _text(x: float, y: float, body: str, cls: str = "", size: int = 12, weight: str = "normal") -> str:
    c = f" class={quoteattr(cls)}" if cls else ""
    return (f'<text x="{x:.0f}" y="{y:.0f}" font-size="{size}" font-weight="{weight}"{c}>'
            f"{escape(body)}</text>")


def bookie_lines(b: dict[str, Any]) -> dict[str, str]:
    """The texts a bookie's box shows (also what the page's script writes on refresh)."""
    disk = "disk ?" if b.get("disk_used") is None else f"disk {b['disk_used'] * 100:.0f}% used"
    return {"b-state": b["state"], "b-disk": disk,
            "b-rate": f"{b['adds_per_s']:.0f} adds/s  {b['reads_per_s']:.0f} reads/s"}


def _bookie(x: float, y: float, b: dict[str, Any]) -> str:
    lines = bookie_lines(b)
    return "".join([
        f'<g class="bookie" data-bookie={quoteattr(b["bookie_id"])} data-state={quoteattr(b["state"])}>',
        f'<title>{escape(b["bookie_id"])} {escape(b["address"])} instance {escape(b["instance_id"])}</title>',
        f'<rect x="{x}" y="{y}" width="{BOOKIE_W}" height="{BOOKIE_H}" rx="6" class="b-box"/>',
        _text(x + 8, y + 17, b["bookie_id"], "b-id", 13, "bold"),
        _text(x + 8, y + 34, lines["b-state"], "b-state"),
        _text(x + 8, y + 50, lines["b-disk"], "b-disk", 11),
        _text(x + 8, y + 65, lines["b-rate"], "b-rate", 11),
        "</g>",
    ])


def cluster_map(cluster: dict[str, Any]) -> str:
    """The front page's picture; an empty cluster draws a box saying so."""
    parts: list[str] = []
    y = 0.0
    width = 300.0
    for region in cluster["regions"]:
        x = PAD
        region_top = y
        zone_h = 0.0
        zone_parts: list[str] = []
        for zone in region["zones"]:
            zx = x
            rack_x = zx + PAD
            tallest = 0
            for rack in zone["racks"]:
                n = len(rack["bookies"])
                rack_h = HEAD + n * (BOOKIE_H + PAD) + PAD
                tallest = max(tallest, rack_h)
                zone_parts.append(f'<rect x="{rack_x}" y="{region_top + 2 * HEAD + PAD}" width="{BOOKIE_W + 2 * PAD}" '
                                  f'height="{rack_h}" class="rack"/>')
                zone_parts.append(_text(rack_x + 6, region_top + 3 * HEAD + PAD - 6, f"rack {rack['rack']}",
                                        "rack-label", 11))
                for i, b in enumerate(rack["bookies"]):
                    zone_parts.append(_bookie(rack_x + PAD, region_top + 3 * HEAD + PAD + i * (BOOKIE_H + PAD), b))
                rack_x += BOOKIE_W + 3 * PAD
            zw = rack_x - zx
            zh = HEAD + PAD + tallest + PAD
            zone_h = max(zone_h, zh)
            zone_parts.insert(0, f'<rect x="{zx}" y="{region_top + HEAD + PAD}" width="{zw}" height="{{ZH}}" '
                                 f'class="zone" data-zone={quoteattr(zone["zone"])}/>')
            zone_parts.append(_text(zx + 6, region_top + 2 * HEAD + PAD - 6, f"zone {zone['zone']}", "zone-label", 12,
                                    "bold"))
            x = zx + zw + PAD
        region_h = HEAD + PAD + zone_h + PAD
        parts.append(f'<rect x="0" y="{region_top}" width="{x}" height="{region_h}" class="region"/>')
        parts.append(_text(6, region_top + HEAD - 6, f"region {region['region']}", "region-label", 14, "bold"))
        parts.extend(p.replace("{ZH}", f"{zone_h}") for p in zone_parts)
        width = max(width, x)
        y = region_top + region_h + PAD
    if not cluster["regions"]:
        parts.append(_text(10, 30, "no bookies registered", "empty", 14))
        y = 50
    return (f'<svg xmlns="http://www.w3.org/2000/svg" id="cluster-map" viewBox="0 0 {width:.0f} {y:.0f}" '
            f'width="{width:.0f}" height="{y:.0f}">{"".join(parts)}</svg>')


def ledger_fragments(ledger: dict[str, Any]) -> str:
    """One row per fragment: its entry range, then its ensemble's bookies coloured by zone."""
    zones = [b["zone"] for f in ledger["fragments"] for b in f["bookies"]]
    colours = zone_colours(zones)
    cell_w, cell_h, label_w = 130, 34, 150
    parts: list[str] = []
    for row, f in enumerate(ledger["fragments"]):
        y = row * (cell_h + PAD) + PAD
        last = f["last_entry_id"]
        parts.append(_text(4, y + 21, f"entries {f['first_entry_id']}..{'' if last < 0 else last}", "frag-label"))
        for col, b in enumerate(f["bookies"]):
            x = label_w + col * (cell_w + 4)
            parts.append(f'<g class="slot" data-bookie={quoteattr(b["bookie_id"])} data-zone={quoteattr(b["zone"])}>'
                         f'<rect x="{x}" y="{y}" width="{cell_w}" height="{cell_h}" rx="4" '
                         f'fill="{colours[b["zone"]]}"/>'
                         + _text(x + 6, y + 14, b["bookie_id"], "slot-id", 11, "bold")
                         + _text(x + 6, y + 28, f"{b['zone']} ({b['state']})", "slot-zone", 10) + "</g>")
    height = len(ledger["fragments"]) * (cell_h + PAD) + PAD
    legend_y = height + 6
    for i, (zone, colour) in enumerate(sorted(colours.items())):
        x = label_w + i * 120
        parts.append(f'<rect x="{x}" y="{legend_y}" width="14" height="14" fill="{colour}"/>')
        parts.append(_text(x + 18, legend_y + 12, zone, "legend", 11))
    width = label_w + max((len(f["bookies"]) for f in ledger["fragments"]), default=1) * (cell_w + 4)
    width = max(width, label_w + len(colours) * 120)
    height = legend_y + 24
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="ledger-map" viewBox="0 0 {width} {height}" '
            f'width="{width}" height="{height}">{"".join(parts)}</svg>')


def stream_timeline(stream: dict[str, Any], width: int = 800) -> str:
    """A stream's segments left to right; width by record count (an open one gets a share)."""
    segments = stream["segments"]
    if not segments:
        return '<svg xmlns="http://www.w3.org/2000/svg" width="200" height="24"><text x="4" y="16" font-size="12">' \
               "no segments</text></svg>"
    weights = [max(s["records"], 1) for s in segments]
    open_share = max(sum(weights) // max(len(weights), 1), 1)
    weights = [open_share if s["state"] == "open" else w for s, w in zip(segments, weights, strict=True)]
    total = sum(weights)
    x = 0.0
    parts = []
    for s, w in zip(segments, weights, strict=True):
        sw = max(width * w / total, 40)
        parts.append(f'<g class="segment" data-seq="{s["seq"]}" data-state={quoteattr(s["state"])}>'
                     f'<title>segment {s["seq"]}: ledger {s["ledger_id"]}, {s["records"]} records, '
                     f'{s["size_bytes"]} bytes, {escape(s["first"])}..{escape(s["last"])}</title>'
                     f'<rect x="{x:.1f}" y="0" width="{sw - 2:.1f}" height="36" rx="3" class="seg-{s["state"]}"/>'
                     + _text(x + 4, 15, f"#{s['seq']} L{s['ledger_id']}", "seg-label", 11)
                     + _text(x + 4, 30, f"{s['records']} rec", "seg-label", 10) + "</g>")
        x += sw
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" viewBox="0 0 {x:.0f} 38" '
            f'width="{x:.0f}" height="38">{"".join(parts)}</svg>')


def sparkline(values: Sequence[float], width: int = 160, height: int = 30) -> str:
    if len(values) < 2:
        return f'<svg xmlns="http://www.w3.org/2000/svg" class="spark" width="{width}" height="{height}"></svg>'
    top = max(max(values), 1e-9)
    step = width / (len(values) - 1)
    points = " ".join(f"{i * step:.1f},{height - 2 - (v / top) * (height - 4):.1f}" for i, v in enumerate(values))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="spark" width="{width}" height="{height}">'
            f'<polyline fill="none" stroke="#4e79a7" stroke-width="1.5" points="{points}"/></svg>')


def lag_chart(series: dict[str, Any], window_s: float, now_s: float, width: int = 640, height: int = 160) -> str:
    """One geo link's lag over the window: records behind (blue, left scale) and seconds behind
    (orange, right scale) against time, the newest sample at the right edge."""
    left, right, top, bottom = 56, 56, 10, 22
    plot_w, plot_h = width - left - right, height - top - bottom
    samples = series["samples"]
    start = now_s - window_s
    records_max = max((s[1] for s in samples), default=0.0) or 1.0
    seconds_max = max((s[2] for s in samples), default=0.0) or 1.0

    def points(index: int, top_value: float) -> str:
        return " ".join(f"{left + max(0.0, (s[0] - start) / window_s) * plot_w:.1f},"
                        f"{top + plot_h - (s[index] / top_value) * plot_h:.1f}" for s in samples)

    parts = [
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fafafa" stroke="#ccc"/>',
        _text(4, top + 10, f"{records_max:g} rec", "axis", 10),
        _text(4, top + plot_h, "0", "axis", 10),
        _text(left + plot_w + 4, top + 10, f"{seconds_max:g} s", "axis", 10),
        _text(left, height - 6, f"-{window_s / 60:g} min", "axis", 10),
        _text(left + plot_w - 20, height - 6, "now", "axis", 10),
        f'<text x="{left + plot_w / 2 - 90:.0f}" y="{height - 6}" font-size="10" fill="#4e79a7">records behind</text>',
        f'<text x="{left + plot_w / 2 + 10:.0f}" y="{height - 6}" font-size="10" fill="#f28e2b">seconds behind</text>',
        f'<polyline class="lag-records" fill="none" stroke="#4e79a7" stroke-width="1.5" points="{points(1, records_max)}"/>',
        f'<polyline class="lag-seconds" fill="none" stroke="#f28e2b" stroke-width="1.5" points="{points(2, seconds_max)}"/>',
    ]
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="lag-chart" data-stream={quoteattr(series["stream"])} '
            f'data-source={quoteattr(series["source"])} viewBox="0 0 {width} {height}" width="{width}" '
            f'height="{height}">{"".join(parts)}</svg>')
