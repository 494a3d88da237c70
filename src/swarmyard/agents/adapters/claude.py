"""Claude Code (``claude -p``): Anthropic Messages through the broker, swarmyard tools through MCP."""

from __future__ import annotations

import json

from swarmyard.agents.adapters.base import WORKER_INSTRUCTIONS, AdapterContext, AgentLaunch, base_env


class ClaudeAdapter:
    """Runs ``claude -p`` with an MCP config that holds only the swarmyard server."""

    name = "claude"
    package = "npm:@anthropic-ai/claude-code"
    venv = None
    finding_file = None  # it submits its finding itself, over MCP
    governed_refusal = None
    #: Claude Code's own tools, each also denied by name in governed mode (``--tools ""`` is the switch; a CLI
    #: version that ignored it would still be held to this list)
    BUILTIN_TOOLS = ("Bash", "BashOutput", "KillShell", "Edit", "MultiEdit", "Write", "Read", "NotebookEdit",
                     "Glob", "Grep", "LS", "WebFetch", "WebSearch", "Task", "TodoWrite", "SlashCommand", "Skill")
    #: Every tool Claude Code 2.1.197 knows but ``Read`` (it offers a ``claude -p`` 24 of them, ``Glob`` and ``Grep``
    #: once ``Bash`` is gone, and the rest in other modes). A settings file's deny rule removes its tool from what
    #: the model is offered, also under ``--dangerously-skip-permissions``; one that names a tool the CLI does not
    #: know is warned about on stderr at every start, so only names it knows are here.
    ALL_BUT_READ = ("Agent", "AskUserQuestion", "Bash", "BashOutput", "CronCreate", "CronDelete", "CronList", "Edit",
                    "EnterPlanMode", "EnterWorktree", "ExitPlanMode", "ExitWorktree", "Glob", "Grep", "KillShell",
                    "LSP", "ListMcpResourcesTool", "Monitor", "NotebookEdit", "PowerShell", "ReadMcpResourceTool",
                    "ReportFindings", "ScheduleWakeup", "SendMessage", "Skill", "Task", "TaskCreate", "TaskGet",
                    "TaskList", "TaskOutput", "TaskStop", "TaskUpdate", "TodoWrite", "WebFetch", "WebSearch",
                    "Workflow", "Write")

    def read_only_settings(self) -> dict[str, object]:
        """User settings (``~/.claude/settings.json``) under which a bare ``claude -p`` offers its model ``Read``
        alone: see ``swarmyard.boxd._logins`` for where they are written."""
        return {"permissions": {"deny": list(self.ALL_BUT_READ)}}

    def launch(self, ctx: AdapterContext) -> AgentLaunch:
        """Files, argv and env for one headless Claude Code run."""
        mcp_path = f"{ctx.home}/.swarmyard/claude-mcp.json"
        mcp = {
            "mcpServers": {
                "swarmyard": {
                    "command": ctx.mcp_command[0],
                    "args": list(ctx.mcp_command[1:]),
                    "env": ctx.mcp_env,
                }
            }
        }
        env = base_env(ctx) | {
            # Claude Code appends /v1/messages itself; the token is sent as x-api-key and the broker swaps it
            "ANTHROPIC_BASE_URL": ctx.relay_url,
            "ANTHROPIC_API_KEY": ctx.token,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            # connect the MCP server before the first request: in the background its tools may be missing from it
            "MCP_CONNECTION_NONBLOCKING": "false",
        }
        argv = (
            "claude",
            "-p",
            WORKER_INSTRUCTIONS.format(prompt=ctx.prompt),
            "--model",
            ctx.model,
            "--output-format",
            "json",
            "--mcp-config",
            mcp_path,
            "--strict-mcp-config",
            "--allowedTools",
            "mcp__swarmyard",
            *(("--tools", "", "--disallowedTools", ",".join(self.BUILTIN_TOOLS), "--permission-mode", "default")
              if ctx.governed else ("--permission-mode", "bypassPermissions")),
        )
        return AgentLaunch(argv, env, {mcp_path: json.dumps(mcp, indent=2)})
