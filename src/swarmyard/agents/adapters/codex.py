"""Codex (``codex exec``): the Responses API through a custom provider with websockets off."""

from __future__ import annotations

import json

from swarmyard.agents.adapters.base import WORKER_INSTRUCTIONS, AdapterContext, AgentLaunch, base_env


def _plane_tools() -> frozenset[str]:
    from swarmyard.plane.tools import TOOL_NAMES  # the MCP server's tools are the plane's

    return frozenset(TOOL_NAMES)


def _toml_str(value: str) -> str:
    # a JSON string is a valid TOML basic string for the characters we write
    return json.dumps(value)


class CodexAdapter:
    """Runs ``codex exec`` with ``CODEX_HOME`` holding a config.toml for the provider and MCP server."""

    name = "codex"
    package = "npm:@openai/codex"
    venv = None
    finding_file = None  # it submits its finding itself, over MCP
    governed_refusal = None

    def config_toml(self, ctx: AdapterContext) -> str:
        """The config.toml: a custom provider on the relay (the built-in ``openai`` cannot be re-pointed)."""
        env = ", ".join(f"{k} = {_toml_str(v)}" for k, v in ctx.mcp_env.items())
        args = ", ".join(_toml_str(a) for a in ctx.mcp_command[1:])
        return "\n".join(
            [
                f"model = {_toml_str(ctx.model)}",
                'model_provider = "swarmyard"',
                'approval_policy = "never"',
                ('sandbox_mode = "read-only"  # governed: and [features] below takes its shell away' if ctx.governed
                 else 'sandbox_mode = "danger-full-access"  # the swarmyard machine is the sandbox'),
                # governed: no hosted web search (the broker drops hosted tools too); newer Codex reads this key
                *(['web_search = "disabled"'] if ctx.governed else []),
                "",
                # the older and the newer names of each feature: Codex renames them (view_image_tool became
                # view_image), and one it no longer knows is ignored
                *(["[features]  # governed: no shell, no exec, no patching, no images, no sub-agents or goals: "
                   "swarmyard's MCP tools only",
                   "shell_tool = false", "unified_exec = false", "apply_patch_freeform = false",
                   "view_image_tool = false", "view_image = false", "web_search_request = false",
                   "multi_agent = false", "goals = false", ""] if ctx.governed else []),
                "[model_providers.swarmyard]",
                'name = "swarmyard"',
                f"base_url = {_toml_str(ctx.relay_url + '/v1')}",
                'env_key = "SWARMYARD_TOKEN"',
                'wire_api = "responses"',
                "supports_websockets = false  # websockets would bypass base_url",
                # Codex reads no x-should-retry: it would resend a call the broker answered upstream_unknown
                # (a second hold for one call); a stream it "reconnects" is the same request sent again
                "request_max_retries = 0",
                "stream_max_retries = 0",
                "",
                "[mcp_servers.swarmyard]",
                f"command = {_toml_str(ctx.mcp_command[0])}",
                f"args = [{args}]",
                f"env = {{ {env} }}",
                # wait for it before the first turn (else the first answer may call a tool not yet listed)
                "required = true",
                "",
                # governed: the read-only sandbox asks approval for every MCP call and approval_policy = "never"
                # refuses it; swarmyard's own tools (and only they) are approved by name
                *(line for name in sorted(_plane_tools()) for line in
                  (f"[mcp_servers.swarmyard.tools.{name}]", 'approval_mode = "approve"', "")
                  if ctx.governed),
            ]
        )

    def launch(self, ctx: AdapterContext) -> AgentLaunch:
        """Files, argv and env for one headless Codex run."""
        codex_home = f"{ctx.home}/.codex"
        env = base_env(ctx) | {"CODEX_HOME": codex_home}
        argv = (
            "codex",
            "exec",
            "--skip-git-repo-check",
            "--cd",
            ctx.workdir,
            "--json",
            WORKER_INSTRUCTIONS.format(prompt=ctx.prompt),
        )
        return AgentLaunch(argv, env, {f"{codex_home}/config.toml": self.config_toml(ctx)})
