"""Where a run's trace goes: ``--otlp`` first, then the standard OpenTelemetry variables; bad URLs refused."""

from __future__ import annotations

import pytest

from swarmyard.errors import UserError
from swarmyard.telemetry import otlp_url


@pytest.mark.parametrize(("flag", "env", "url"), [
    (None, {}, None),
    ("http://127.0.0.1:4318", {}, "http://127.0.0.1:4318/v1/traces"),
    ("http://127.0.0.1:4318/", {}, "http://127.0.0.1:4318/v1/traces"),
    ("https://collector:4318/v1/traces", {}, "https://collector:4318/v1/traces"),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "http://c:4318/v1/traces"),
    # the traces variable is a full URL, taken as it is, and wins over the base one
    (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/x", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:2"},
     "http://t:1/x"),
    ("http://flag:1", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:2"}, "http://flag:1/v1/traces"),
])
def test_the_endpoint(flag: str | None, env: dict[str, str], url: str | None) -> None:
    assert otlp_url(flag, env) == url


@pytest.mark.parametrize("bad", ["127.0.0.1:4318", "grpc://c:4317", "file:///tmp/x", ""])
def test_a_url_that_is_not_http_is_refused(bad: str) -> None:
    with pytest.raises(UserError, match="http"):
        otlp_url(bad, {})
