"""The agent's HTTP API, served on the gossip listener (same mutual TLS, same identity check).

Operator-facing (see the HTTP contract in ``agent/operator/client.py``): ``POST /v1/commands`` (a
sealed command), ``GET /v1/jobs``, ``/v1/jobs/{id}``, ``/v1/jobs/{id}/logs``, ``/v1/nodes``,
``/v1/events``, ``/v1/history`` (this node's stored samples, :mod:`agent.wire.history`),
``/metrics``, ``/healthz``, and ``/v1/openapi.json``, which describes them all
(:mod:`agent.daemon.openapi`). Errors are ``{"error": "<one line>"}`` with a 4xx/5xx.

Agent-to-agent, role ``agent`` only (403 otherwise), all JSON POSTs under ``/v1/internal/``:
``command`` (a forwarded sealed command, executed here without forwarding again), the calls of
the job protocol (``agent.daemon.calls``: ``replicate``, ``adopt``, ``start``, ``stop``, ``status``,
``report``, ``checkpointed``, ``stored_job`` (a retired job's stored record), and a gang's
``gang_prepare``, ``gang_commit``, ``gang_abort``, and ``confirm_start``, a runner asking the
job's other owner before it starts an attempt),
``GET /v1/internal/logs/{id}`` (the runner's log, proxied by the API), and the content
store's manifests, holdings and chunks under ``/v1/internal/content/`` (``agent.content.routes``:
datasets, working folders, environments, images and checkpoints alike, a checkpoint only to an
agent with a say over its job);
``GET /v1/content/stages`` shows this node's stages (``agent.content.stage``). A job's log takes
``attempt`` and, with it, ``node``: that attempt's part on one of a gang's members.

Refusals: a sealed command must come as ``application/octet-stream`` and an internal JSON call as
``application/json`` (415 otherwise); ``lines`` of a log request is at most
``logfiles.MAX_TAIL_LINES`` (400 otherwise). Every answer of 400 or more on these routes, and
the router's own 404 and 405, is counted by route and status (``shoal_api_refused_total``);
refusals made before a request reaches a route (identity, rate limit) are the transport's own
counters.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web
from aiohttp.typedefs import Middleware

from agent.common.errors import ApiError
from agent.common.parsing import json_loads
from agent.content.fetch import PATH as CONTENT_PATH
from agent.content.routes import ContentServer
from agent.content.routes import Routes as ContentRoutes
from agent.content.stage import Stager
from agent.content.store import DiskStore
from agent.daemon.calls import Calls
from agent.daemon.commands import Commands
from agent.daemon.metrics import AgentMetrics
from agent.daemon.policywire import PolicyWire
from agent.daemon.reads import Reads
from agent.execution.logfiles import MAX_TAIL_LINES
from agent.history.history_hints import GpuFacts
from agent.history.history_store import History, QueryError
from agent.history.usage_book import UsageBook
from agent.mesh.events import EventLog
from agent.mesh.mesh import GossipMesh
from agent.mesh.peers import JSON_CONTENT_TYPE, stream_call_op
from agent.people.keeper import PolicyKeeper
from agent.storage.store import StoreFull
from agent.wire.codec import ENVELOPE_CONTENT_TYPE
from agent.wire.health import MAX_HEALTH_WAIT_S, HealthDoc
from gossip.node import CallHandler
from gossip.tls import PeerIdentity
from gossip.transport import PATH as GOSSIP_PATH
from gossip.transport import request_peer

log = logging.getLogger("shoal.api")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AgentService(Protocol):
    """What the routes need of an agent (``agent.daemon.daemon.Agent`` provides it)."""

    @property
    def node_id(self) -> str: ...

    @property
    def metrics(self) -> AgentMetrics: ...

    @property
    def events(self) -> EventLog: ...

    @property
    def mesh(self) -> GossipMesh: ...

    @property
    def commands(self) -> Commands: ...

    @property
    def calls(self) -> Calls: ...

    @property
    def people(self) -> PolicyKeeper: ...

    @property
    def policy_wire(self) -> PolicyWire: ...

    @property
    def usage(self) -> UsageBook: ...

    @property
    def history(self) -> History: ...

    def device_keys(self) -> dict[int, str]:
        """This node's devices: index (as ``shoal nodes`` numbers them) -> key."""
        ...

    def gpu_facts(self) -> dict[str, GpuFacts]:
        """This node's GPUs: whether a job holds each, and its slowdown temperature."""
        ...

    @property
    def reads(self) -> Reads: ...

    @property
    def content(self) -> ContentServer: ...

    @property
    def stager(self) -> Stager: ...

    @property
    def content_store(self) -> DiskStore: ...


INSUFFICIENT_STORAGE = 507
"""The answer when this agent's store cannot be written (its disk is full)."""


def error(status: int, message: str) -> web.Response:
    text = " ".join(str(message).split())[:300]
    return web.json_response({"error": text}, status=status)


def _guarded(fn: Handler) -> Handler:
    async def wrapper(request: web.Request) -> web.StreamResponse:
        try:
            return await fn(request)
        except ApiError as exc:
            return error(exc.status, str(exc))
        except StoreFull as exc:  # nothing of the request was kept: the caller may retry
            return error(INSUFFICIENT_STORAGE, f"this agent's data folder is full: {exc}")
        except (KeyError, ValueError, TypeError) as exc:
            return error(400, f"malformed request: {exc}")
        except web.HTTPException:
            raise
        except Exception as exc:
            log.exception("%s %s failed", request.method, request.path)
            return error(500, f"internal error: {type(exc).__name__}")

    return wrapper


def _route(request: web.Request) -> str:
    """The route's pattern (``/v1/jobs/{job_id}``), so that labels stay few."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "(no route)"


def refusal_counter(refused: Counter[tuple[str, str]]) -> Middleware:
    """A middleware counting every answer of 400 or more by (route, status)."""

    @web.middleware
    async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == GOSSIP_PATH:  # the gossip route has its own counters
            return await handler(request)
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status >= 400:
                refused[(_route(request), str(exc.status))] += 1
            raise
        if response.status >= 400:
            refused[(_route(request), str(response.status))] += 1
        return response

    return count


def _require_content_type(request: web.Request, expected: str) -> None:
    if request.content_type != expected:
        raise ApiError(415, f"content type must be {expected}, not {request.content_type!r}")


async def _sealed_body(request: web.Request) -> bytes:
    """A sealed command's bytes (checked for their content type before any is read)."""
    _require_content_type(request, ENVELOPE_CONTENT_TYPE)
    return await request.read()


def _internal(fn: Handler) -> Handler:
    async def wrapper(request: web.Request) -> web.StreamResponse:
        if request_peer(request).role != "agent":
            return error(403, "agent role required")
        return await fn(request)

    return _guarded(wrapper)


async def _json_body(request: web.Request) -> dict[str, Any]:
    _require_content_type(request, JSON_CONTENT_TYPE)
    return _json_object(await request.read())


def _json_object(data: bytes) -> dict[str, Any]:
    try:
        body = json_loads(data)
    except ValueError:
        raise ApiError(400, "body is not JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "body must be a JSON object")
    return body


INTERNAL_PREFIX = "/v1/internal/"


def stream_calls(agent: AgentService) -> CallHandler:
    """The internal POST routes (``command`` and the job protocol's calls) for calls that come
    over a gossip stream (:meth:`gossip.node.GossipNode.serve_calls`): the same role check,
    content types, handlers, error answers and refusal counters as over HTTP. The log stream
    (``GET``) stays on HTTP."""

    async def answer(
        peer: PeerIdentity, path: str, content_type: str, data: bytes
    ) -> tuple[int, dict[str, Any]]:
        op = stream_call_op(path)
        if op is None:
            return 404, {"error": f"no such call {path[:80]!r}"}
        if peer.role != "agent":
            return 403, {"error": "agent role required"}
        try:
            if op == "command":
                if content_type != ENVELOPE_CONTENT_TYPE:
                    raise ApiError(415, f"content type must be {ENVELOPE_CONTENT_TYPE}")
                return await agent.commands.execute(data, forwarded=True)
            if content_type != JSON_CONTENT_TYPE:
                raise ApiError(415, f"content type must be {JSON_CONTENT_TYPE}")
            return 200, await agent.calls.handle(op, _json_object(data), peer.node_id)
        except ApiError as exc:
            return exc.status, {"error": " ".join(str(exc).split())[:300]}
        except StoreFull as exc:  # nothing of the request was kept: the caller may retry
            return INSUFFICIENT_STORAGE, {"error": f"this agent's data folder is full: {exc}"}
        except (KeyError, ValueError, TypeError) as exc:
            return 400, {"error": f"malformed request: {exc}"[:300]}
        except Exception as exc:
            log.exception("stream call %s failed", path)
            return 500, {"error": f"internal error: {type(exc).__name__}"}

    async def handle(
        peer: PeerIdentity, path: str, content_type: str, data: bytes
    ) -> tuple[int, bytes]:
        status, body = await answer(peer, path, content_type, data)
        if status >= 400:
            command = path.endswith("/command")
            route = f"{INTERNAL_PREFIX}command" if command else f"{INTERNAL_PREFIX}{{op}}"
            agent.metrics.api_refused[(route, str(status))] += 1
        return status, json.dumps(body, separators=(",", ":")).encode()

    return handle


def _query_int(request: web.Request, name: str, low: int, high: int, default: int = 0) -> int:
    text = request.query.get(name, str(default))
    try:
        value = int(text)
    except ValueError:
        raise ApiError(400, f"{name} must be an integer, not {text[:20]!r}") from None
    if not low <= value <= high:
        raise ApiError(400, f"{name} must be between {low} and {high}")
    return value


def _log_query(request: web.Request) -> tuple[int, bool, int | None]:
    """A log request's ``lines`` (default 100, at most ``MAX_TAIL_LINES``), ``follow``, and
    ``attempt`` (None: the log as the runner holds it)."""
    lines = _query_int(request, "lines", 0, MAX_TAIL_LINES, default=100)
    follow = request.query.get("follow", "0") in ("1", "true", "yes")
    attempt = None
    if "attempt" in request.query:
        attempt = _query_int(request, "attempt", 1, 1 << 31)
    return lines, follow, attempt


def setup(app: web.Application, agent: AgentService) -> None:
    """Add every route of the agent to the listener's application."""
    app.middlewares.append(refusal_counter(agent.metrics.api_refused))

    @_guarded
    async def commands(request: web.Request) -> web.StreamResponse:
        data = await _sealed_body(request)
        status, answer = await agent.commands.execute(data, forwarded=False)
        return web.json_response(answer, status=status)

    @_guarded
    async def jobs(request: web.Request) -> web.StreamResponse:
        from agent.wire.documents import jobs_to_wire

        return web.json_response(jobs_to_wire(agent.reads.jobs()))

    @_guarded
    async def job(request: web.Request) -> web.StreamResponse:
        return web.json_response((await agent.reads.job(request.match_info["job_id"])).to_wire())

    @_guarded
    async def logs(request: web.Request) -> web.StreamResponse:
        lines, follow, attempt = _log_query(request)
        job_id = request.match_info["job_id"]
        node = request.query.get("node") or None
        return await agent.reads.logs(request, job_id, lines, follow, attempt, node)

    @_guarded
    async def nodes(request: web.Request) -> web.StreamResponse:
        from agent.wire.documents import nodes_to_wire

        return web.json_response(nodes_to_wire(agent.reads.nodes()))

    @_guarded
    async def events(request: web.Request) -> web.StreamResponse:
        since = int(request.query.get("since", "0"))
        return web.json_response(agent.events.since(since).to_wire())

    @_guarded
    async def history(request: web.Request) -> web.StreamResponse:
        from agent.wire.codec import WireError
        from agent.wire.history import HistoryQuery

        now = time.time()
        try:
            query = HistoryQuery.from_params(request.query, now)
            agent.history.flush(now)  # the last seconds too
            doc = await asyncio.to_thread(
                agent.history.answer,
                query,
                agent.node_id,
                agent.device_keys(),
                now,
                agent.gpu_facts() if query.hints else None,
            )
        except (WireError, QueryError) as exc:
            raise ApiError(400, str(exc)) from None
        return web.json_response(doc.to_wire())

    @_guarded
    async def query_range(request: web.Request) -> web.StreamResponse:
        from agent.wire import prom_range

        params = dict(request.query)
        if request.method == "POST":  # Grafana posts the form
            params.update({k: str(v) for k, v in (await request.post()).items()})
        now = time.time()
        try:
            q = prom_range.parse(params)
            node = q.labels.get("node")
            if node is not None and node != agent.node_id:
                raise prom_range.PromError(f"this agent is node {agent.node_id}: ask {node[:40]}'s")
            subject = q.labels.get("subject")
            agent.history.flush(now)
            keys = [
                k
                for k in agent.history.select([q.name], None if subject is None else [subject])
                if k.name == q.name
            ]
            answers = await asyncio.to_thread(
                agent.history.query, now, keys, int(q.start_s), int(q.end_s) + 1, q.step_s
            )
        except (prom_range.PromError, QueryError) as exc:
            return web.json_response(prom_range.error(str(exc)), status=400)
        series = [
            (a.key.subject, [(p.t_s, p.avg) for p in a.points])
            for a in answers
            if a.unsupported is None
        ]
        return web.json_response(prom_range.matrix(agent.node_id, q, series))

    @_guarded
    async def policy(request: web.Request) -> web.StreamResponse:
        held = agent.people.held
        return web.json_response(
            {
                "version": agent.people.version,
                "record": None if held is None else base64.b64encode(held.encode()).decode(),
                "digest": agent.policy_wire.digest,
                "policy": None if held is None else held.body.to_wire(),
            }
        )

    @_guarded
    async def usage(request: web.Request) -> web.StreamResponse:
        from agent.wire.usage import UsageDoc

        since = float(_query_int(request, "since", 0, 1 << 40))
        rows, truncated = await asyncio.to_thread(agent.usage.rows, since)
        return web.json_response(UsageDoc(agent.node_id, time.time(), rows, truncated).to_wire())

    @_guarded
    async def metrics(request: web.Request) -> web.StreamResponse:
        body, content_type = agent.metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})

    @_guarded
    async def healthz(request: web.Request) -> web.StreamResponse:
        # ?members=N&wait_s=S answers once N members are live, or after S seconds (a watcher
        # waits on one request instead of polling)
        members = agent.mesh.member_count()
        if "members" in request.query:
            want = _query_int(request, "members", 0, 1 << 20)
            wait_s = _query_int(request, "wait_s", 0, MAX_HEALTH_WAIT_S)
            members = await agent.mesh.wait_members(want, float(wait_s))
        return web.json_response(HealthDoc(True, agent.node_id, members).to_wire())

    @_guarded
    async def openapi(request: web.Request) -> web.StreamResponse:
        from agent.daemon import openapi

        return web.json_response(openapi.document())

    @_internal
    async def i_command(request: web.Request) -> web.StreamResponse:
        data = await _sealed_body(request)
        status, answer = await agent.commands.execute(data, forwarded=True)
        return web.json_response(answer, status=status)

    @_internal
    async def i_op(request: web.Request) -> web.StreamResponse:
        op = request.match_info["op"]
        body = await _json_body(request)
        caller = request_peer(request).node_id
        answer = await agent.calls.handle(op, body, caller)
        return web.json_response(answer)

    @_internal
    async def i_logs(request: web.Request) -> web.StreamResponse:
        lines, follow, attempt = _log_query(request)
        job_id = request.match_info["job_id"]
        return await agent.reads.local_logs(request, job_id, lines, follow, attempt)

    content = ContentRoutes(agent.content)

    @_guarded
    async def stages(request: web.Request) -> web.StreamResponse:
        states = [s.to_wire() for s in agent.stager.states()]
        return web.json_response({"node": agent.node_id, "stages": states})

    @_guarded
    async def cache(request: web.Request) -> web.StreamResponse:
        from agent.daemon.cachelist import cache_doc

        store = agent.content_store
        held = await asyncio.to_thread(store.all_held)
        doc = cache_doc(agent.node_id, held, store.store_bytes(), store.rules.budget_bytes)
        return web.json_response(doc)

    def _member(fn: Callable[[web.Request, str], Awaitable[web.StreamResponse]]) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await fn(request, request_peer(request).node_id)

        return _internal(handler)

    app.router.add_post("/v1/commands", commands)
    app.router.add_get("/v1/jobs", jobs)
    app.router.add_get("/v1/jobs/{job_id}", job)
    app.router.add_get("/v1/jobs/{job_id}/logs", logs)
    app.router.add_get("/v1/nodes", nodes)
    app.router.add_get("/v1/events", events)
    app.router.add_get("/v1/history", history)
    app.router.add_get("/v1/policy", policy)
    app.router.add_get("/v1/usage", usage)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/api/v1/query_range", query_range)
    app.router.add_post("/api/v1/query_range", query_range)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/v1/openapi.json", openapi)
    app.router.add_post("/v1/internal/command", i_command)
    app.router.add_get("/v1/internal/logs/{job_id}", i_logs)
    app.router.add_get("/v1/content/stages", stages)
    app.router.add_get("/v1/cache", cache)
    app.router.add_get(f"{CONTENT_PATH}/chunk/{{chunk}}", _member(content.chunk))
    app.router.add_get(f"{CONTENT_PATH}/{{digest}}", _member(content.manifest))
    app.router.add_get(f"{CONTENT_PATH}/{{digest}}/have", _member(content.have))
    app.router.add_get(f"{CONTENT_PATH}/{{digest}}/chunks", _member(content.bundle))
    app.router.add_post("/v1/internal/{op}", i_op)
