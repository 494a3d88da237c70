"""The OpenTelemetry GenAI semantic conventions' attribute registry, as the installed semantic-conventions
package ships it, to check span attributes against; and a reader of OTLP/JSON lines files."""

from __future__ import annotations

import ast
import itertools
import json
from pathlib import Path
from typing import Any

#: swarmyard's one attribute in the gen_ai namespace the conventions do not define: a call's cost in USD, the
#: name Langfuse reads into a generation's cost (the conventions name no cost attribute)
UNOFFICIAL = frozenset({"gen_ai.usage.cost"})


def registry() -> dict[str, str]:
    """Each ``gen_ai.*`` attribute name of the registry -> the first line of its description."""
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes

    body = ast.parse(Path(gen_ai_attributes.__file__).read_text()).body
    out = {}
    for node, after in itertools.pairwise(body):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str) and node.value.value.startswith("gen_ai.")):
            doc = after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) else ""
            out[node.value.value] = str(doc).strip().splitlines()[0] if doc else ""
    return out


def off_convention(attributes: dict[str, Any]) -> list[str]:
    """The ``gen_ai.*`` names in ``attributes`` that the conventions do not have, or have replaced or removed
    (an attribute that only "moved" to the GenAI conventions' own repository is current)."""
    known = registry()
    bad = []
    for name in attributes:
        if not name.startswith("gen_ai.") or name in UNOFFICIAL:
            continue
        note = known.get(name)
        if note is None or "Replaced by" in note or "Removed" in note:
            bad.append(name)
    return bad


def _value(value: dict[str, Any]) -> Any:
    (kind, inner), = value.items()
    if kind == "arrayValue":
        return tuple(_value(v) for v in inner.get("values", []))
    if kind == "intValue":
        return int(inner)
    return inner


def otlp_json_spans(path: Path) -> list[dict[str, Any]]:
    """The spans of an OTLP/JSON lines file (one ExportTraceServiceRequest a line): name, ids in hex, attributes."""
    out = []
    for line in path.read_text().splitlines():
        for resource in json.loads(line)["resourceSpans"]:
            service = {a["key"]: _value(a["value"]) for a in resource["resource"]["attributes"]}["service.name"]
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    out.append({"name": span["name"], "trace": span["traceId"], "id": span["spanId"],
                                "parent": span.get("parentSpanId", ""), "service": service,
                                "attrs": {a["key"]: _value(a["value"]) for a in span.get("attributes", [])},
                                "start": int(span["startTimeUnixNano"]), "end": int(span["endTimeUnixNano"]),
                                "status": span.get("status", {})})
    return out
