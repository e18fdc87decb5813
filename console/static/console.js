// Scriba console: live refresh without a reload (no library, no build step).
// The cluster map fetches /api/cluster and updates each bookie in place; other pages
// fetch their own URL with X-Console-Fragment: 1 and swap in the new <main>.
"use strict";
const REFRESH_MS = 2000;
const live = document.getElementById("live");
const banner = document.getElementById("store-status");

function lines(b) {
  const disk = b.disk_used === null ? "disk ?" : `disk ${Math.round(b.disk_used * 100)}% used`;
  return {"b-state": b.state, "b-disk": disk, "b-drain": b.decommission,
          "b-rate": `${Math.round(b.adds_per_s)} adds/s  ${Math.round(b.reads_per_s)} reads/s`};
}

function showStore(store) {
  banner.hidden = !store.error;
  if (store.error) banner.textContent = `${store.error} — showing the last copy; reconnecting`;
}

async function refreshCluster() {
  const doc = await (await fetch("/api/cluster")).json();
  showStore(doc.store);
  const seen = new Set();
  for (const region of doc.regions) for (const zone of region.zones) for (const rack of zone.racks)
    for (const b of rack.bookies) {
      seen.add(b.bookie_id);
      for (const el of document.querySelectorAll(`[data-bookie="${CSS.escape(b.bookie_id)}"]`)) {
        el.dataset.state = b.state;
        for (const [cls, text] of Object.entries(lines(b))) {
          const t = el.querySelector("." + cls);
          if (t) { t.textContent = text; if (cls === "b-state") t.setAttribute("class", `b-state state-${b.state}`); }
        }
      }
    }
  const shown = document.querySelectorAll("g.bookie").length;
  if (seen.size !== shown) await refreshPage();  // a bookie came or went: redraw the map
  const counts = document.getElementById("counts");
  if (counts) counts.innerHTML = `${doc.counts["writable"]} writable, ${doc.counts["read-only"]} read-only, ` +
    `<span class="state-down">${doc.counts["down"]} down</span>`;
}

async function refreshPage() {
  const reply = await fetch(location.href, {headers: {"X-Console-Fragment": "1"}});
  if (reply.ok) live.innerHTML = await reply.text();
  const store = await (await fetch("/api/status")).json();
  showStore(store);
}

async function tick() {
  try {
    if (live.dataset.refresh === "cluster") await refreshCluster(); else await refreshPage();
    document.body.dataset.refreshed = String(Date.now());
  } catch (err) {
    banner.hidden = false;
    banner.textContent = `refresh failed: ${err}`;
  }
  setTimeout(tick, REFRESH_MS);
}
setTimeout(tick, REFRESH_MS);

// Actions (only drawn when the console runs with --allow-actions): the first POST returns a
// summary and a confirmation token; the operator confirms in the box; the second POST runs it.
const confirmBox = document.getElementById("confirm-box");
const result = document.getElementById("action-result");
let pending = null;

async function postAction(kind, args) {
  const reply = await fetch(`/api/actions/${encodeURIComponent(kind)}`, {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(args)});
  return [reply.ok, await reply.json()];
}

function showResult(ok, text) {
  result.hidden = false;
  result.className = ok ? "done" : "failed";
  result.textContent = text;
}

document.addEventListener("click", async (event) => {
  const button = event.target.closest("button.action");
  if (!button) return;
  const kind = button.dataset.action, args = JSON.parse(button.dataset.args);
  const [ok, doc] = await postAction(kind, args);
  if (!ok) { showResult(false, `${kind}: ${doc.error}`); return; }
  pending = {kind, args, token: doc.confirm};
  document.getElementById("confirm-summary").textContent = doc.summary;
  confirmBox.hidden = false;
});

document.getElementById("confirm-no").addEventListener("click", () => { pending = null; confirmBox.hidden = true; });
document.getElementById("confirm-yes").addEventListener("click", async () => {
  if (!pending) return;
  const {kind, args, token} = pending;
  pending = null;
  confirmBox.hidden = true;
  showResult(true, `${kind}: running…`);
  const [ok, doc] = await postAction(kind, {...args, confirm: token});
  showResult(ok, ok ? `${kind} done: ${JSON.stringify(doc.result)}` : `${kind} refused: ${doc.error}`);
});
