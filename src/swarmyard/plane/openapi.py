"""The OpenAPI 3.1 document at ``/openapi.json``, written from the pydantic models that validate requests."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from swarmyard.plane import models as m
from swarmyard.plane.operator import ENDPOINTS
from swarmyard.plane.tools import TOOLS
from swarmyard.plane.trajectory import StepAccepted, StepRecord

_REF = "#/components/schemas/{model}"
_ERRORS = {
    "400": "Invalid input (names the field)",
    "401": "Missing, forged, expired or revoked token",
    "403": "Token used outside its scope",
    "404": "Unknown id",
    "409": "Stale fencing token, lost lease or conflict",
    "413": "Body or post too large",
    "429": "Rate limited (see Retry-After)",
}


def _error_responses(codes: tuple[str, ...]) -> dict[str, Any]:
    ref = {"$ref": _REF.format(model="ErrorResult")}
    out: dict[str, Any] = {}
    for code in codes:
        out[code] = {"description": _ERRORS[code], "content": {"application/json": {"schema": ref}}}
    out["429"]["headers"] = {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait"}}
    return out


def _query_parameters(model: type[BaseModel], schema: dict[str, Any]) -> list[dict[str, Any]]:
    props: dict[str, Any] = schema.get("properties", {})
    return [{"name": name, "in": "query", "required": name in schema.get("required", []), "schema": prop}
            for name, prop in props.items()]


def build_openapi(version: str) -> dict[str, Any]:
    """The whole document."""
    models: list[type[BaseModel]] = [m.ErrorResult, StepRecord, StepAccepted]
    for spec in TOOLS:
        models += [spec.request, spec.response]
    for ep in ENDPOINTS:
        models += [ep.response] + [x for x in (ep.body, ep.query) if x is not None]
    unique = list(dict.fromkeys(models))
    keyed, defs = models_json_schema([(model, "validation") for model in unique], ref_template=_REF)
    schemas: dict[str, Any] = dict(defs.get("$defs", {}))

    def ref(model: type[BaseModel]) -> dict[str, Any]:
        return dict(keyed[(model, "validation")])

    paths: dict[str, Any] = {}
    worker_errors = ("400", "401", "403", "404", "409", "413", "429")
    for spec in TOOLS:
        paths[f"/v1/tools/{spec.name}"] = {"post": {
            "operationId": spec.name, "summary": spec.summary, "tags": ["worker tools"],
            "security": [{"bearer": []}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": ref(spec.request)}}},
            "responses": {"200": {"description": "OK",
                                  "content": {"application/json": {"schema": ref(spec.response)}}},
                          **_error_responses(worker_errors)},
        }}
    paths["/v1/trajectory/steps"] = {"post": {
        "operationId": "trajectory_step", "summary": "Report one agent step (kept in the worker's trajectory)",
        "tags": ["worker tools"], "security": [{"bearer": []}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": ref(StepRecord)}}},
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": ref(StepAccepted)}}},
                      **_error_responses(("400", "401", "413", "429"))},
    }}
    for ep in ENDPOINTS:
        op: dict[str, Any] = {
            "operationId": f"operator_{ep.name}", "summary": ep.summary, "tags": ["operator"],
            "security": [{"bearer": []}],
            "responses": {str(ep.status): {"description": "OK",
                                           "content": {"application/json": {"schema": ref(ep.response)}}},
                          **_error_responses(("400", "401", "403", "404", "409", "413", "429"))},
        }
        params = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                  for name in re.findall(r"{(\w+)}", ep.path)]
        if ep.query is not None:
            params += _query_parameters(ep.query, ep.query.model_json_schema(ref_template=_REF))
        if params:
            op["parameters"] = params
        if ep.body is not None:
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref(ep.body)}}}
        paths.setdefault(ep.path, {})[ep.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "swarmyard control plane", "version": version,
                 "description": "Worker tools (capability token) and the operator API (operator token)."},
        "paths": paths,
        "components": {"schemas": schemas,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
