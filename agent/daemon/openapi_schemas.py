"""The schemas of the agent's OpenAPI document (:mod:`agent.daemon.openapi`): one per wire
document, following :mod:`agent.wire.documents` and :mod:`agent.wire.health` (a field a newer
agent adds is allowed: ``additionalProperties`` is left open)."""

from __future__ import annotations

from typing import Any, Final


def _t(kind: str, nullable: bool = False) -> dict[str, Any]:
    return {"type": [kind, "null"] if nullable else kind}


def _obj(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "required": sorted(required),
        "properties": {**required, **(optional or {})},
    }


def schema_ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


_STR, _INT, _NUM, _BOOL = _t("string"), _t("integer"), _t("number"), _t("boolean")
_OPT_STR, _OPT_INT, _OPT_NUM = _t("string", True), _t("integer", True), _t("number", True)
_STRS = _array(_STR)
_STR_MAP = {"type": "object", "additionalProperties": _STR}

SCHEMAS: Final[dict[str, Any]] = {
    "Error": _obj({"error": _STR}),
    "Host": _obj(
        {"hostname": _STR, "os": _STR, "arch": _STR},
        {"cpu_count": _OPT_INT, "mem_total_bytes": _OPT_INT},
    ),
    "Device": _obj(
        {"index": _INT, "key": _STR, "vendor": _STR, "backend": _STR, "name": _STR},
        {
            "source": _STR,
            "vendor_index": _INT,
            "uuid": _OPT_STR,
            "pci_bus_id": _OPT_STR,
            "arch": _OPT_STR,
            "compute_capability": _OPT_STR,
            "unified_memory": _BOOL,
            "mem_total_bytes": _OPT_INT,
            "compute_units": _OPT_INT,
            "temp_slowdown_c": _OPT_NUM,
            "links": _array(
                _obj(
                    {"peer": _STR, "kind": _STR},
                    {"bandwidth_mbps": _OPT_INT, "detail": _OPT_STR},
                )
            ),
            "mig": _array(_obj({"uuid": _STR}, {"name": _OPT_STR, "mem_total_bytes": _OPT_INT})),
            "mem_used_bytes": _OPT_INT,
            "util_pct": _OPT_NUM,
            "temp_c": _OPT_NUM,
            "power_mw": _OPT_INT,
            "power_limit_mw": _OPT_INT,
            "healthy": _BOOL,
        },
    ),
    "Node": _obj(
        {"node_id": _STR, "state": _STR},
        {
            "addr": _OPT_STR,
            "role": _OPT_STR,
            "drain": _OPT_STR,
            "labels": _STR_MAP,
            "host": {"oneOf": [schema_ref("Host"), {"type": "null"}]},
            "devices": _array(schema_ref("Device")),
            "telemetry_age_s": _OPT_NUM,
            "telemetry_every_s": _OPT_NUM,
            "running_jobs": _STRS,
            "queue": _INT,
            "wire_version": _OPT_INT,
            "features": _STRS,
            "container_runtime": _OPT_STR,
            "datasets": {"type": "object", "additionalProperties": _INT},
            "dataset_versions": _array(
                _obj(
                    {
                        "name": _STR,
                        "digest": _STR,
                        "total_bytes": _INT,
                        "held_bytes": _INT,
                        "created_s": _NUM,
                    }
                )
            ),
            "fetch_rates": {
                "type": "object",
                "description": "member -> bytes/s this node measured fetching content from it",
                "additionalProperties": _NUM,
            },
            "content": _array(
                _obj({"kind": _STR, "name": _STR, "digest": _STR, "total_bytes": _INT})
            ),
            "shares": {
                "type": "object",
                "description": "device key -> {job id -> bytes of its memory the job holds}: the"
                " devices that run shares of one GPU",
                "additionalProperties": {"type": "object", "additionalProperties": _INT},
            },
        },
    ),
    "Nodes": _obj({"nodes": _array(schema_ref("Node"))}),
    "Attempt": _obj(
        {"attempt": _INT},
        {
            "node": _OPT_STR,
            "started_at": _OPT_NUM,
            "finished_at": _OPT_NUM,
            "cause": _OPT_STR,
            "exit_code": _OPT_INT,
            "rank": _INT,
        },
    ),
    "Member": _obj({"rank": _INT, "node": _STR, "devices": _STRS}),
    "Job": _obj(
        {"job_id": _STR, "state": _STR},
        {
            "attempt": _INT,
            "owner": _OPT_STR,
            "runner": _OPT_STR,
            "devices": _STRS,
            "submitted_at": _OPT_NUM,
            "started_at": _OPT_NUM,
            "finished_at": _OPT_NUM,
            "exit_code": _OPT_INT,
            "signal": _OPT_STR,
            "reason": _OPT_STR,
            "gen": _INT,
            "attempts": _array(schema_ref("Attempt")),
            "members": _array(schema_ref("Member")),
            "spec": {"type": "object", "description": "the job spec as the operator signed it"},
            "progress": _OPT_NUM,
            "eta_s": _OPT_NUM,
            "deadline_missed_s": {
                **_OPT_NUM,
                "description": "how late the job was when its owner said it missed its deadline",
            },
        },
    ),
    "Jobs": _obj({"jobs": _array(schema_ref("Job"))}),
    "Event": _obj(
        {"seq": _INT, "kind": _STR, "message": _STR},
        {"at": _OPT_NUM, "node": _OPT_STR, "job_id": _OPT_STR},
    ),
    "Events": _obj({"events": _array(schema_ref("Event")), "next": _INT}),
    "UsageRow": _obj(
        {
            "job_id": _STR,
            "attempt": _INT,
            "node": _STR,
            "person": _OPT_STR,
            "name": _OPT_STR,
            "team": _OPT_STR,
            "model": _STR,
            "gpus": _NUM,
            "started_at": _NUM,
            "finished_at": _OPT_NUM,
            "energy_j": _OPT_NUM,
        }
    ),
    "Usage": _obj(
        {"node": _STR, "at": _NUM, "rows": _array(schema_ref("UsageRow")), "truncated": _BOOL}
    ),
    "Policy": _obj(
        {"version": _INT, "record": _OPT_STR, "digest": _OPT_STR, "policy": _t("object", True)}
    ),
    "Health": _obj({"ok": _BOOL, "node_id": _STR, "members": _INT}),
    "HistorySeries": _obj(
        {
            "name": _STR,
            "subject": {**_STR, "description": "a device key, a job id, or '' for the host"},
            "unsupported": {
                **_OPT_STR,
                "description": "why the device does not expose it (no points), or null",
            },
            "tier": {"type": "string", "enum": ["s", "m", "h"]},
            "step_s": _INT,
            "points": _array(
                {
                    "type": "array",
                    "description": "[t, min, avg, max]; null where no sample fell in the step",
                    "items": _OPT_NUM,
                    "minItems": 4,
                    "maxItems": 4,
                }
            ),
        }
    ),
    "HistoryHint": _obj({"device": _STR, "rule": _STR, "evidence": _STR}, {"unjudged": _BOOL}),
    "History": _obj(
        {"node": _STR, "from": _INT, "to": _INT, "series": _array(schema_ref("HistorySeries"))},
        {"hints": _array(schema_ref("HistoryHint"))},
    ),
    "Answer": {
        "type": "object",
        "description": "a command's or an internal call's answer; an error has `error`",
    },
}
