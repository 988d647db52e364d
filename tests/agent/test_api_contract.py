"""The agent's HTTP API against its OpenAPI description (``agent/daemon/openapi.py``).

Every route the listener registers is described and every route described is registered. Then a
real agent process, driven over mutual TLS by requests generated from the description (valid
values, values out of range, garbage), as an operator and as a member: no answer is a 5xx, none
hangs, and each one's status and body are what the description says they may be.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.daemon import api, openapi
from agent.job.jobspec import new_job_id
from gossip.identity import load_identity
from gossip.server import GossipServer
from gossip.tls import client_context
from gossip.transport import PROTOCOL_HEADER, PROTOCOL_VERSION
from tests.agent.agents import Mesh, spec, started
from tests.agent.authority_kit import Kit
from tests.hostile import JSON, NASTY_TEXT, mutated

DOC = openapi.document()
SCHEMAS = DOC["components"]["schemas"]

# -- the description and the routes --------------------------------------------------------------


async def test_every_route_is_described_and_every_description_is_a_route(tmp_path: Path) -> None:
    kit = Kit(tmp_path)
    me = kit.agent("a")
    apps = []

    def setup(app: Any) -> None:
        apps.append(app)
        api.setup(
            app,
            SimpleNamespace(metrics=SimpleNamespace(api_refused=Counter()), content=None),
        )  # type: ignore[arg-type]

    async def echo(data: bytes, peer: Any) -> bytes:
        return data

    async with GossipServer(me, kit.cluster.ca.certificate, echo, app_setup=setup):
        (app,) = apps
        registered = {
            (route.method.lower(), route.resource.canonical)
            for route in app.router.routes()
            if route.method != "HEAD" and route.resource is not None
        }
    described = {(method, path) for path, ops in DOC["paths"].items() for method in ops}
    assert registered == described
    assert len(described) >= 12


def test_the_description_is_valid_as_far_as_its_references_go() -> None:
    refs = set(re.findall(r'"#/components/schemas/([A-Za-z]+)"', json.dumps(DOC)))
    assert refs <= set(SCHEMAS), refs - set(SCHEMAS)
    for path, ops in DOC["paths"].items():
        params = set(re.findall(r"{(\w+)}", path))
        for op in ops.values():
            assert "200" in op["responses"] or "204" in op["responses"], path
            in_path = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert in_path == params, path


# -- a small JSON Schema checker: the subset the description uses --------------------------------


def check(value: Any, schema: dict[str, Any], where: str = "$") -> None:
    if "$ref" in schema:
        return check(value, SCHEMAS[schema["$ref"].rsplit("/", 1)[1]], where)
    if "oneOf" in schema:
        matches = 0
        for option in schema["oneOf"]:
            try:
                check(value, option, where)
                matches += 1
            except AssertionError:
                pass
        assert matches == 1, f"{where}: {value!r} matches {matches} of oneOf"
        return None
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        assert any(_is(value, k) for k in kinds), f"{where}: {value!r} is not {kinds}"
    if "enum" in schema:
        assert value in schema["enum"], f"{where}: {value!r} not in {schema['enum']}"
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            assert key in value, f"{where}: {key!r} missing"
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if key in props:
                check(item, props[key], f"{where}.{key}")
            elif isinstance(extra, dict):
                check(item, extra, f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            check(item, schema["items"], f"{where}[{i}]")
    return None


def _is(value: Any, kind: str) -> bool:
    return {
        "null": value is None,
        "boolean": isinstance(value, bool),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "string": isinstance(value, str),
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }[kind]


def test_the_checker_can_fail() -> None:
    good = {"ok": True, "node_id": "n", "members": 1}
    check(good, {"$ref": "#/components/schemas/Health"})
    for bad in ({**good, "members": "1"}, {"ok": True}, [good], {**good, "ok": None}):
        with pytest.raises(AssertionError):
            check(bad, {"$ref": "#/components/schemas/Health"})


# -- requests generated from the description -----------------------------------------------------

QUERY_CAPS = {"wait_s": 1, "members": 2}
"""Parameters whose valid range would hold a request open (``/healthz`` waits up to ``wait_s``
for ``members``): generated within these, so a run stays short."""


def _param(param: dict[str, Any], known_jobs: list[str]) -> st.SearchStrategy[str]:
    schema = param["schema"]
    garbage = NASTY_TEXT | st.text(max_size=8)
    if "enum" in schema:
        return st.sampled_from(schema["enum"]) | garbage
    if schema.get("type") == "integer":
        high = min(schema.get("maximum", 10**6), QUERY_CAPS.get(param["name"], 10**18))
        low = schema.get("minimum", 0)
        valid = st.integers(low, high).map(str)
        return valid | valid | st.integers().map(str) | garbage
    if "pattern" in schema:
        valid = st.from_regex(schema["pattern"], fullmatch=True)
        return st.sampled_from(known_jobs) | valid | garbage
    return st.sampled_from(["1", "0", "true", "no"]) | garbage


@st.composite
def requests(draw: Any, known_jobs: list[str], bodies: dict[str, Any]) -> tuple[str, str, Any]:
    path, ops = draw(st.sampled_from(sorted(DOC["paths"].items())))
    method = draw(st.sampled_from(sorted(ops)))
    op = ops[method]
    url = path
    query = {}
    for param in op.get("parameters", []):
        if param["in"] == "path":
            value = draw(_param(param, known_jobs))
            quoted = urllib.parse.quote(value, safe="", errors="surrogatepass")
            url = url.replace("{" + param["name"] + "}", quoted)
        elif draw(st.booleans()):
            query[param["name"]] = draw(_param(param, known_jobs))
    if query:
        url += "?" + urllib.parse.urlencode(query, errors="surrogatepass")
    body = None
    if "requestBody" in op:
        content_type = draw(st.sampled_from([*op["requestBody"]["content"], "text/plain"]))
        body = (content_type, draw(bodies.get(content_type, st.binary(max_size=64))))
    return method.upper(), url, body


NO_ROUTE = {
    "responses": {
        status: {"content": {"text/plain": {}}} for status in ("404", "405", "401", "403", "429")
    }
}
"""What the router answers for a path or method the description does not have (an empty job id,
say): its own 404 or 405 (or the listener's refusals), in text."""


def _operation(path: str, method: str) -> dict[str, Any]:
    for pattern, ops in DOC["paths"].items():
        regex = re.sub(r"\\{\w+\\}", "[^/]+", re.escape(pattern))
        if re.fullmatch(regex, path) and method.lower() in ops:
            if pattern == "/v1/internal/{op}" and path.rsplit("/", 1)[1] in ("command", "logs"):
                continue
            return dict(ops[method.lower()])
    return NO_ROUTE


class Client:
    """HTTPS requests to one agent as one identity; each answer checked against the
    description."""

    def __init__(self, address: str, context: ssl.SSLContext) -> None:
        self.address = address
        self.context = context
        self.statuses: Counter[int] = Counter()

    def send(self, method: str, url: str, body: tuple[str, bytes] | None) -> int:
        data = None if body is None else body[1]
        req = urllib.request.Request(f"https://{self.address}{url}", data=data, method=method)
        if body is not None:
            req.add_header("Content-Type", body[0])
        if url.startswith("/v1/gossip"):
            req.add_header(PROTOCOL_HEADER, PROTOCOL_VERSION)
        try:
            with urllib.request.urlopen(req, context=self.context, timeout=15) as resp:
                status, headers, raw = resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as exc:
            with exc:  # its response holds the socket: closed here, not whenever it is collected
                status, headers, raw = exc.code, exc.headers, exc.read()
        self.statuses[status] += 1
        where = f"{method} {url} -> {status}: {raw[:200]!r}"
        assert status < 500, where
        path = urllib.parse.urlsplit(url).path
        responses = _operation(path, method)["responses"]
        assert str(status) in responses, where
        described = responses[str(status)].get("content", {})
        content_type = (headers.get("Content-Type") or "").split(";")[0].strip()
        if not described:
            assert not raw, where
            return status
        assert content_type in described, f"{where} (content type {content_type})"
        if content_type == "application/json":
            check(json.loads(raw), described[content_type]["schema"], where)
        return status


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with started(tmp_path_factory.mktemp("contract"), ["h100:1"]) as m:
        yield m


@pytest.fixture(scope="module")
def finished_job(mesh: Mesh) -> str:
    a = mesh.agents[0]
    job_id = new_job_id()
    body = {"job_id": job_id, "spec": spec(["echo", "hello"], gpus=0)}
    assert mesh.command(a, "submit", body)[0] == 200
    mesh.wait("the job done", lambda: mesh.job(a, job_id)["state"] == "succeeded")
    return job_id


def _bodies(mesh: Mesh, job_id: str) -> dict[str, Any]:
    kinds = st.sampled_from(["submit", "cancel", "migrate", "cordon", "undrain", "nonsense"])
    job = {"job_id": job_id, "spec": spec(["true"], gpus=0)}
    sealed = st.builds(
        lambda kind, body: mesh.seal(kind, body) if isinstance(body, dict) else mesh.seal(kind, {}),
        kinds,
        mutated(job, JSON) | JSON,
    )
    call = {"job_id": job_id, "attempt": 1, "devices": [], "owner": "o" * 32, "submission": ""}
    as_json = (mutated(call, JSON) | JSON).map(lambda v: json.dumps(v).encode())
    return {
        "application/octet-stream": sealed | st.binary(max_size=64),
        "application/json": as_json | st.binary(max_size=32),
        "application/msgpack": st.binary(max_size=64),
        "text/plain": st.binary(max_size=16),
    }


CONTRACT = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)


@pytest.mark.slow
@pytest.mark.parametrize("who", ["operator", "member"])
def test_a_live_agent_answers_every_generated_request_as_described(
    mesh: Mesh, finished_job: str, who: str
) -> None:
    a = mesh.agents[0]
    identity = mesh.operator if who == "operator" else load_identity(a.directory / "identity")
    client = Client(a.address, client_context(identity, identity.ca_certificate))
    known = [finished_job, new_job_id()]
    started = time.monotonic()

    @CONTRACT
    @given(request=requests(known, _bodies(mesh, finished_job)))
    def run(request: tuple[str, str, Any]) -> None:
        client.send(*request)

    run()
    # Every route was reached, and the agent is still itself.
    assert client.statuses[200] > 5, client.statuses
    assert mesh.get(a, "/healthz")["ok"] is True
    assert mesh.job(a, finished_job)["state"] == "succeeded"
    assert time.monotonic() - started < 120


def test_the_description_is_served(mesh: Mesh) -> None:
    status, raw = mesh.request(mesh.agents[0], "GET", openapi.PATH)
    assert status == 200
    assert json.loads(raw) == json.loads(json.dumps(DOC))


def test_a_sealed_body_in_base64_is_not_a_command(mesh: Mesh) -> None:
    """A sealed command sent as text (base64) is refused as malformed, not executed."""
    a = mesh.agents[0]
    sealed = base64.b64encode(mesh.seal("cordon", {"node": a.node_id}))
    status, raw = mesh.request(a, "POST", "/v1/commands", sealed, "application/octet-stream")
    assert 400 <= status < 500, raw
    assert mesh.get(a, "/v1/nodes")["nodes"][0]["drain"] == "schedulable"
