"""The agent's HTTP API described as OpenAPI 3.1, served at ``GET /v1/openapi.json``.

One description for operators writing their own clients and for the tests, which check that
every route the agent registers is described here and every route described is registered, then
drive a live agent with requests generated from it and check each answer against it
(``tests/agent/test_api_contract.py``). The schemas follow the wire contract's documents
(:mod:`agent.wire.documents`, :mod:`agent.wire.health`): a field a newer agent adds is allowed
(``additionalProperties`` is left open, as readers ignore fields they do not know).

Every route answers over mutual TLS only: a client certificate of the cluster's CA is the
authentication (``security`` names it). Routes under ``/v1/internal/`` are for agents (role
``agent`` in the certificate); an operator is answered 403 there.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any, Final

from agent.daemon.openapi_schemas import (
    SCHEMAS,
    schema_ref,
)
from agent.execution.logfiles import MAX_TAIL_LINES
from agent.wire.health import MAX_HEALTH_WAIT_S

PATH: Final = "/v1/openapi.json"
INTERNAL_CALLS: Final = (
    "replicate",
    "adopt",
    "start",
    "stop",
    "status",
    "report",
    "checkpointed",
    "checkpoint_of",
    "checkpoint_copy",
    "checkpoint_grant",
    "stored_job",
    "gang_prepare",
    "gang_commit",
    "gang_abort",
    "confirm_start",
    "prefetch",
    "quota_claim",
    "image_export",
)
"""The agent-to-agent calls of ``POST /v1/internal/{op}`` (``agent.daemon.calls``)."""

# -- operations ----------------------------------------------------------------------------------


def _json(schema: str) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema_ref(schema)}}}


def _answers(ok: str | None, *errors: int) -> dict[str, Any]:
    """``ok``'s document for 200 (when given), and the refusals: the route's own (``errors``,
    answered as JSON) and the transport's, which any request may meet (text)."""
    out: dict[str, Any] = {}
    if ok is not None:
        out["200"] = {"description": "OK", **_json(ok)}
    for status in sorted({*errors, *TRANSPORT_REFUSALS}):
        out[str(status)] = {
            "description": _REASONS[status],
            "content": {
                "application/json": {"schema": schema_ref("Error")},
                "text/plain": {"schema": {"type": "string"}},
            },
        }
    return out


TRANSPORT_REFUSALS: Final = (401, 403, 413, 429)
"""What the listener answers before a route is reached: no client certificate (401), a
certificate not admitted (403), a body over the limit (413), a peer over its rate (429)."""
_REASONS: Final = {
    400: "malformed request",
    401: "no client certificate",
    403: "a certificate not admitted, or a role that may not do this",
    404: "no such job, call or route",
    409: "refused in the current state (a replayed command, a lacking feature, a checkpoint "
    "asked of an attempt that did not run here last)",
    413: "body over the size limit",
    415: "wrong content type",
    429: "rate limited (per peer; Retry-After)",
    500: "the handler failed (a defect: the log says which)",
    502: "a cancel recorded whose runner could not be made to stop the job (the error says why)",
    503: "no agent could answer for it",
    504: "a cancel recorded whose runner has not confirmed the stop yet (its owner keeps asking)",
    507: "the agent's data folder is full: nothing of the request was kept",
}

_JOB_ID = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
}


def _digest(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
    }


def _query(name: str, low: int, high: int, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": {"type": "integer", "minimum": low, "maximum": high},
    }


_LOG_QUERY = [
    _query("lines", 0, MAX_TAIL_LINES, "the last N lines (default 100)"),
    {
        "name": "follow",
        "in": "query",
        "required": False,
        "description": "keep the answer open and stream new lines (`1`, `true`, `yes`)",
        "schema": {"type": "string"},
    },
    _query("attempt", 1, 1 << 31, "one attempt's log (default: as the runner holds it)"),
]
_NODE_QUERY = {
    "name": "node",
    "in": "query",
    "required": False,
    "description": "with `attempt`: that attempt's log on this node (a gang's member)",
    "schema": {"type": "string"},
}
_TEXT_ANSWER = {
    "description": "the log's lines",
    "content": {"text/plain": {"schema": {"type": "string"}}},
}


def _text_query(name: str, description: str, pattern: str | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    if pattern is not None:
        schema["pattern"] = pattern
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


_SECONDS = "^[0-9]+(\\.[0-9]+)?$"
_HISTORY_QUERY = [
    _text_query(
        "series",
        "comma-separated series names or prefixes (`gpu` is every `gpu.*`); default all",
        "^[A-Za-z0-9_.]+(,[A-Za-z0-9_.]+)*$",
    ),
    _text_query("node", "this agent's node id (or a prefix): each node answers for itself"),
    _text_query("device", "a device key, or its index as `shoal nodes` shows it"),
    _text_query("job", "a job id: that job's series"),
    _text_query("from", "seconds since the epoch (default: an hour before `to`)", _SECONDS),
    _text_query("to", "seconds since the epoch (default: now)", _SECONDS),
    _query("step", 1, 10**9, "seconds between points (default: about 600 points)"),
    {
        "name": "hints",
        "in": "query",
        "required": False,
        "description": "1: each GPU's bottleneck hints over the five minutes before `to`",
        "schema": {"type": "string", "enum": ["0", "1"]},
    },
]
_BINARY: Final = {"schema": {"type": "string", "format": "binary"}}
_MSGPACK: Final = {"application/msgpack": _BINARY}
_FRAME: Final = {"application/octet-stream": _BINARY}


def _json_doc(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"type": "object"}}},
    }


def _needed(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": True,
        "description": description,
        "schema": {"type": "string", "pattern": "^[0-9]+$"},
    }


_SEALED_BODY = {
    "required": True,
    "description": "an operator-signed command (`gossip.envelope.seal`: msgpack)",
    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
}
_ANSWER = {"description": "the command's answer", **_json("Answer")}


def _command(summary: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": _SEALED_BODY,
            "responses": {
                "200": _ANSWER,
                **_answers(None, 400, 404, 409, 415, 502, 503, 504, 507),
            },
        }
    }


PATHS: Final[dict[str, Any]] = {
    "/v1/commands": _command(
        "Execute an operator's signed command (submit, cancel, migrate, cordon, drain, undrain, "
        "revoke), forwarding it to the agent that acts on it"
    ),
    "/v1/jobs": {"get": {"summary": "Every job this agent knows", "responses": _answers("Jobs")}},
    "/v1/jobs/{job_id}": {
        "get": {
            "summary": "One job",
            "parameters": [_JOB_ID],
            "responses": _answers("Job", 400, 404),
        }
    },
    "/v1/jobs/{job_id}/logs": {
        "get": {
            "summary": "A job's log, from the agent that runs or ran it (at most 4 MiB)",
            "parameters": [_JOB_ID, *_LOG_QUERY, _NODE_QUERY],
            "responses": {"200": _TEXT_ANSWER, **_answers(None, 400, 404, 503)},
        }
    },
    "/v1/nodes": {
        "get": {"summary": "The mesh as this agent sees it", "responses": _answers("Nodes")}
    },
    "/v1/events": {
        "get": {
            "summary": "The mesh's event log, from sequence number `since` on",
            "parameters": [_query("since", 0, (1 << 63) - 1, "the first sequence number")],
            "responses": _answers("Events", 400),
        }
    },
    "/v1/usage": {
        "get": {
            "summary": "Accounting: the attempts that ran on this node (open ones too) and ended "
            "at or after `since`, oldest first, each with its GPUs, model, submitter and energy",
            "parameters": [_query("since", 0, 1 << 40, "seconds since the epoch")],
            "responses": _answers("Usage", 400),
        }
    },
    "/v1/policy": {
        "get": {
            "summary": "The team policy this agent holds: its version, the admin-signed record "
            "(base64, its body inline), the body's content digest and what it says (people, "
            "teams, ceilings, quotas)",
            "responses": _answers("Policy"),
        }
    },
    "/v1/history": {
        "get": {
            "summary": "This node's stored samples (1 s for a day, 1 min min/avg/max for 30 "
            "days, 1 h for a year), from its own store",
            "parameters": _HISTORY_QUERY,
            "responses": _answers("History", 400),
        }
    },
    "/api/v1/query_range": {
        op: {
            "summary": "A subset of Prometheus's query_range over this node's history (one "
            "series selector, `=` label matchers on subject and node), for Grafana",
            "parameters": [
                {"name": n, "in": "query", "required": True, "schema": {"type": "string"}}
                for n in ("query", "start", "end", "step")
            ],
            "responses": {
                "200": {
                    "description": "Prometheus's matrix answer",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                },
                "400": {
                    "description": "Prometheus's error answer (bad_data)",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                },
            },
        }
        for op in ("get", "post")
    },
    "/metrics": {
        "get": {
            "summary": "Prometheus metrics",
            "responses": {
                "200": {
                    "description": "the text exposition format",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                **_answers(None),
            },
        }
    },
    "/healthz": {
        "get": {
            "summary": "Liveness and member count; with `members`, waits until that many are live",
            "parameters": [
                _query("members", 0, 1 << 20, "wait until this many members are live"),
                _query("wait_s", 0, MAX_HEALTH_WAIT_S, "for at most this long"),
            ],
            "responses": _answers("Health", 400),
        }
    },
    PATH: {
        "get": {
            "summary": "This description",
            "responses": {
                "200": {
                    "description": "OpenAPI 3.1",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                },
                **_answers(None),
            },
        }
    },
    "/v1/internal/command": _command("A command forwarded by another agent (role agent)"),
    "/v1/internal/logs/{job_id}": {
        "get": {
            "summary": "The log this agent holds of a job it runs or ran (role agent)",
            "parameters": [_JOB_ID, *_LOG_QUERY],
            "responses": {"200": _TEXT_ANSWER, **_answers(None, 400, 404)},
        }
    },
    "/v1/content/stages": {
        "get": {
            "summary": "This node's stages of content (`shoal data stage`): state, bytes held of"
            " the total, rate, holders, ETA",
            "responses": {"200": _json_doc("{node, stages}"), **_answers(None)},
        }
    },
    "/v1/cache": {
        "get": {
            "summary": "What this node's content store keeps (`shoal cache`): datasets, images,"
            " environments and working folders, with sizes, pins and last use",
            "responses": {
                "200": _json_doc("{node, store_bytes, budget_bytes, items}"),
                **_answers(None),
            },
        }
    },
    "/v1/internal/content/{digest}": {
        "get": {
            "summary": "The manifest of content this agent knows (role agent; a checkpoint only "
            "to an agent with a say over its job: its owners, its attempt's starter, the node an "
            "owner named to run its next attempt)",
            "parameters": [_digest("digest", "the manifest's digest")],
            "responses": {"200": _json_doc("the manifest"), **_answers(None, 400, 403, 404)},
        }
    },
    "/v1/internal/content/{digest}/have": {
        "get": {
            "summary": "The chunks of the content this agent holds: whole, or a bitmap (role"
            " agent)",
            "parameters": [_digest("digest", "the manifest's digest")],
            "responses": {"200": _json_doc("{whole, bitmap}"), **_answers(None, 400, 403, 404)},
        }
    },
    "/v1/internal/content/{digest}/chunks": {
        "get": {
            "summary": "Several small chunks of content this agent holds, one after another, by"
            " their place among its distinct chunks (role agent)",
            "parameters": [
                _digest("digest", "the manifest's digest"),
                {
                    **_needed("n", "the chunks' places, comma-separated (at most 128, 8 MiB)"),
                    "schema": {"type": "string", "pattern": "^[0-9]+(,[0-9]+)*$"},
                },
            ],
            "responses": {
                "200": {"description": "the chunks' bytes", "content": _FRAME},
                **_answers(None, 400, 403, 404, 503),
            },
        }
    },
    "/v1/internal/content/chunk/{chunk}": {
        "get": {
            "summary": "One chunk's bytes, of content this agent holds (role agent)",
            "parameters": [
                _digest("chunk", "the chunk's SHA-256"),
                {**_digest("of", "the digest of the manifest it is a chunk of"), "in": "query"},
            ],
            "responses": {
                "200": {"description": "the chunk's bytes", "content": _FRAME},
                **_answers(None, 400, 403, 404, 503),
            },
        }
    },
    "/v1/internal/{op}": {
        "post": {
            "summary": "A call of the job protocol between agents (role agent)",
            "parameters": [
                {
                    "name": "op",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "enum": list(INTERNAL_CALLS)},
                }
            ],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"type": "object"}}},
            },
            "responses": {"200": _ANSWER, **_answers(None, 400, 404, 409, 415, 507)},
        }
    },
    "/v1/gossip": {
        "post": {
            "summary": "Gossip between members (agents, and an operator's TUI): a msgpack frame "
            "of signed messages; needs the `Shoal-Protocol` header",
            "requestBody": {"required": True, "content": _MSGPACK},
            "responses": {
                "200": {"description": "the answer frame", "content": _MSGPACK},
                "204": {"description": "nothing to answer"},
                **_answers(None, 400, 415, 500),
            },
        }
    },
}


def document() -> dict[str, Any]:
    """The whole description."""
    try:
        version = importlib.metadata.version("shoal")
    except importlib.metadata.PackageNotFoundError:
        version = "0+unknown"
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Shoal agent API",
            "version": version,
            "description": (
                "Every Shoal agent serves this API on its gossip port, over mutual TLS with "
                'certificates of the cluster\'s CA. Errors are `{"error": "<one line>"}`.'
            ),
        },
        "paths": PATHS,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "clusterCertificate": {
                    "type": "mutualTLS",
                    "description": "a certificate signed by the cluster's CA (role operator or "
                    "agent); /v1/internal/ is for role agent",
                }
            },
        },
        "security": [{"clusterCertificate": []}],
    }
