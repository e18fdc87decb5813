"""The console's HTTP server (aiohttp): pages under ``/``, JSON under ``/api/``.

Why aiohttp: the console's sources (the metadata store's watches, the bookies' HTTP
probes) are asyncio already, so one event loop serves pages, runs the watches and
probes; aiohttp gives routing, a client for the probes and a small server in one
dependency, no framework on top.

Every page and every ``/api`` answer is built from :class:`~scriba.console.views.Model`
(memory only). Bad input is a 400 with ``{"error", "type"}``, an unknown ledger a 404;
while the metadata store is away the answers carry the last copy and the pages say so
(``/api/status``). Actions (``POST /api/actions/<kind>``, :mod:`~scriba.console.actions`)
answer 403 unless the console was started with ``--allow-actions``. A page asked for with the header ``X-Console-Fragment: 1`` returns only
its ``<main>`` (the refresh script swaps it in), so pages refresh without a reload.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import jinja2
from aiohttp import web

from scriba.console import svg
from scriba.console.actions import ActionFailedError, ActionRefusedError, ActionRequest, Actions
from scriba.console.views import LedgerQuery, Model, parse_ledger_id
from scriba.errors import BadRequestError, NoSuchLedgerError
from scriba.log import get_logger

log = get_logger(__name__)

MODEL: Final = web.AppKey("model", Model)
ACTIONS: Final = web.AppKey("actions", Actions)  # absent: actions are off
BODY_BYTES_MAX: Final = 16 * 1024
FRAGMENT_HEADER: Final = "X-Console-Fragment"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_env = jinja2.Environment(loader=jinja2.PackageLoader("scriba.console", "templates"),
                          autoescape=jinja2.select_autoescape(["html"]), undefined=jinja2.StrictUndefined)
_env.globals["svg"] = svg


def _error_status(exc: Exception) -> int:
    if isinstance(exc, NoSuchLedgerError):
        return 404
    if isinstance(exc, ActionRefusedError):
        return 403
    if isinstance(exc, ActionFailedError):
        return 409
    return 400


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except (BadRequestError, NoSuchLedgerError, ActionRefusedError, ActionFailedError) as exc:
        status = _error_status(exc)
        if request.path.startswith("/api/"):
            return web.json_response({"error": str(exc), "type": type(exc).__name__}, status=status)
        return _render(request, "error.html", status=status, message=str(exc), code=status)


def _render(request: web.Request, template: str, *, status: int = 200, **context: Any) -> web.Response:
    model = request.app[MODEL]
    fragment = request.headers.get(FRAGMENT_HEADER) == "1"
    body = _env.get_template(template).render(store=model.mirror.status(), fragment=fragment,
                                              path=request.path, actions=ACTIONS in request.app, **context)
    return web.Response(text=body, status=status, content_type="text/html")


# --- JSON API ---------------------------------------------------------------------------
async def api_status(request: web.Request) -> web.Response:
    return web.json_response(request.app[MODEL].mirror.status())


async def api_cluster(request: web.Request) -> web.Response:
    return web.json_response(request.app[MODEL].cluster())


async def api_bookies(request: web.Request) -> web.Response:
    return web.json_response(request.app[MODEL].bookies())


async def api_bookie_history(request: web.Request) -> web.Response:
    return web.json_response(request.app[MODEL].bookie_history(request.match_info["bookie_id"]))


async def api_ledgers(request: web.Request) -> web.Response:
    return web.json_response(request.app[MODEL].ledgers(LedgerQuery.parse(dict(request.query))))


async def api_ledger(request: web.Request) -> web.Response:
    return web.json_response(request.app[MODEL].ledger(parse_ledger_id(request.match_info["ledger_id"])))


async def api_streams(request: web.Request) -> web.Response:
    return web.json_response(request.app[MODEL].streams())


async def api_rsm(request: web.Request) -> web.Response:
    return web.json_response(request.app[MODEL].rsm_groups())


async def api_geo(request: web.Request) -> web.Response:
    return web.json_response(request.app[MODEL].geo_lag(time.time()))


async def api_underreplicated(request: web.Request) -> web.Response:
    return web.json_response(request.app[MODEL].underreplicated())


async def api_action(request: web.Request) -> web.Response:
    actions = request.app.get(ACTIONS)
    if actions is None:
        raise ActionRefusedError("actions are off: start the console with --allow-actions to allow them")
    actor = actions.actor(request)
    if request.content_type != "application/json":
        raise BadRequestError(f"an action's body must be application/json, not {request.content_type!r}")
    if (request.content_length or 0) > BODY_BYTES_MAX:
        raise BadRequestError(f"an action's body is at most {BODY_BYTES_MAX} bytes")
    try:
        body = await request.json()
    except ValueError:
        raise BadRequestError("an action's body must be a JSON object") from None
    if not isinstance(body, dict):
        raise BadRequestError("an action's body must be a JSON object")
    token = body.pop("confirm", None)
    if token is not None and not isinstance(token, str):
        raise BadRequestError("confirm: the token string from the first answer")
    action = ActionRequest.parse(request.match_info["kind"], body)
    return web.json_response(await actions.handle(action, actor, token))


# --- pages ----------------------------------------------------------------------------------
async def page_cluster(request: web.Request) -> web.Response:
    model = request.app[MODEL]
    bookies = model.bookies()
    sparks = {b["bookie_id"]: [h["adds_per_s"] for h in model.bookie_history(b["bookie_id"])] for b in bookies}
    return _render(request, "cluster.html", cluster=model.cluster(), bookies=bookies, sparks=sparks)


async def page_ledgers(request: web.Request) -> web.Response:
    query = LedgerQuery.parse(dict(request.query))
    return _render(request, "ledgers.html", doc=request.app[MODEL].ledgers(query))


async def page_ledger(request: web.Request) -> web.Response:
    ledger = request.app[MODEL].ledger(parse_ledger_id(request.match_info["ledger_id"]))
    return _render(request, "ledger.html", ledger=ledger)


async def page_streams(request: web.Request) -> web.Response:
    return _render(request, "streams.html", doc=request.app[MODEL].streams())


async def page_rsm(request: web.Request) -> web.Response:
    return _render(request, "rsm.html", groups=request.app[MODEL].rsm_groups())


async def page_geo(request: web.Request) -> web.Response:
    return _render(request, "geo.html", doc=request.app[MODEL].geo_lag(time.time()))


async def page_recovery(request: web.Request) -> web.Response:
    return _render(request, "recovery.html", rows=request.app[MODEL].underreplicated())


def make_app(model: Model, actions: Actions | None = None) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=BODY_BYTES_MAX)
    app[MODEL] = model
    if actions is not None:
        app[ACTIONS] = actions
    app.router.add_post("/api/actions/{kind}", api_action)
    app.router.add_get("/api/status", api_status)
    app.router.add_get("/api/cluster", api_cluster)
    app.router.add_get("/api/bookies", api_bookies)
    app.router.add_get("/api/bookies/{bookie_id}/history", api_bookie_history)
    app.router.add_get("/api/ledgers", api_ledgers)
    app.router.add_get("/api/ledgers/{ledger_id}", api_ledger)
    app.router.add_get("/api/streams", api_streams)
    app.router.add_get("/api/rsm", api_rsm)
    app.router.add_get("/api/underreplicated", api_underreplicated)
    app.router.add_get("/api/geo", api_geo)
    app.router.add_get("/", page_cluster)
    app.router.add_get("/ledgers", page_ledgers)
    app.router.add_get("/ledgers/{ledger_id}", page_ledger)
    app.router.add_get("/streams", page_streams)
    app.router.add_get("/rsm", page_rsm)
    app.router.add_get("/recovery", page_recovery)
    app.router.add_get("/geo", page_geo)
    app.router.add_static("/static", __file__.rsplit("/", 1)[0] + "/static")
    return app
