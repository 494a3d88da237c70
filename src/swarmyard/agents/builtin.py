"""The built-in agent: claim a task, loop model -> tool -> result under a step cap, submit a finding.

It runs in the worker's machine (``python -m swarmyard.agents``) and reaches the control plane and broker
only through the URL and capability token in its environment. A model that answers with malformed output is
re-asked a bounded number of times; when the step cap or the budget runs out, the agent still submits what it
has. A model that keeps failing is different: a run it cut short after some work submits that work as a partial
finding saying so, and a run it stopped before any work raises ``ProviderError``, so the agent exits non-zero
without a finding and the coordinator counts a failed try (a placeholder would end the task ``done``).
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import logging
import re
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from swarmyard.agents import governed, history
from swarmyard.agents.actions import (
    FINISH,
    TOOLS,
    Action,
    ToolSpec,
    citing,
    parse_reply,
    parse_tool_call,
    salvage_submission,
    with_attached,
)
from swarmyard.agents.explore import Explorer, direction_post
from swarmyard.agents.model import ChatModel, ModelReply
from swarmyard.agents.settings import DIGEST, QUOTED, AgentSettings, Role
from swarmyard.agents.tools import MAX_RESULT_CHARS, ClaimedTask, LocalTools, PlaneTools
from swarmyard.agents.trajectory import StepDraft, TrajectoryReporter, now_ms
from swarmyard.domain import Post, PostKind
from swarmyard.errors import (
    BudgetError,
    BudgetExceededError,
    ContextLengthError,
    FencingError,
    InvalidInputError,
    ProviderError,
    SwarmyardError,
    UnoriginalFindingError,
    UnverifiedCitationError,
)
from swarmyard.plane.client import (
    ToolCall,
    board_post_call,
    board_read_call,
    read_findings_call,
    submit_artifact_call,
)
from swarmyard.plane.tool_results import FindingResult
from swarmyard.rules import grounding, instructions, no_result, originality

log = logging.getLogger(__name__)


class Ending(StrEnum):
    """How an agent run ended."""

    SUBMITTED = "submitted"  # the model chose to submit
    STEP_CAP = "step_cap"  # the step cap ran out; what it had was submitted
    BUDGET = "budget"  # the broker refused further calls; what it had was submitted
    NO_TASK = "no_task"  # nothing was claimable
    CLAIM_REFUSED = "claim_refused"  # the plane refused the claim: the task's budget cannot afford one call
    LOST_CLAIM = "lost_claim"  # the lease expired or another worker took the task
    MODEL_ERROR = "model_error"  # the model kept failing (after retries and compaction) after some work; that
    # work was submitted as a partial finding (with no work done, the run raises instead)


@dataclass(frozen=True, slots=True)
class AgentOutcome:
    """What one agent run did."""

    ending: Ending
    task_id: str | None = None
    finding_id: str | None = None
    steps: int = 0
    malformed: int = 0


_SYSTEM = {Role.WORKER: instructions.WORKER, Role.LEAD: instructions.LEAD}
#: Characters of one finding a digest lead reads in one call, and of one part it writes.
_DIGEST_BODY_CHARS = 1500
#: A digest point the lead could not write in words of its own (its verdict still counts, and its finding is named).
_NO_POINT = "(no sentence of the lead's own: its words copied the finding or were refused)"
_DIGEST_PART_CHARS = 800
#: ``only`` for a call that offers no tool: the model answers in plain text.
_TEXT_ONLY: frozenset[str] = frozenset()


def _said(reply: ModelReply) -> str:
    """A digest part's text: the reply's, or the body of a submission a model answered with all the same."""
    text = reply.text.strip()
    if reply.tool_calls or text.startswith("{"):
        try:
            action = parse_tool_call(*reply.tool_calls[0], TOOLS) if reply.tool_calls else parse_reply(text, TOOLS)
            text = str(action.args.get("body") or "").strip()
        except InvalidInputError:
            pass
    return _cut(" ".join(text.split()), _DIGEST_PART_CHARS) if text else ""
_LAST_STEP = instructions.LAST_STEP
_REASK = instructions.REASK


#: Where a lead with WASI tools finds the findings it was given, as a table (``_write_findings_table``).
FINDINGS_TABLE = "findings.csv"
#: The most recent search lines a finding may cite.
_CITABLE = 12
#: Characters of the tool call an attached finding posts as its evidence.
_EVIDENCE_CHARS = 3000

#: Per-message character limits tried, in turn, when the conversation is too long for the model's window.
_COMPACT_LIMITS = (3000, 1200, 500)
#: Characters of a brief that all findings share, and of each board post in a brief.
FINDINGS_CHARS = 4800
_POST_CHARS = 400


def findings_block(findings: list[tuple[str, str, str]], budget: int = FINDINGS_CHARS) -> str:
    """``[id] title`` and body of each (id, title, body), every body cut to an equal share of ``budget``
    characters, so that the last finding is read as fully as the first."""
    if not findings:
        return ""
    share = max(300, budget // len(findings))
    return "\n\n".join(f"[{ref}] {title}\n{_cut(body, share)}" for ref, title, body in findings)


def _compact(messages: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The conversation cut to fit a smaller window: the system prompt, the brief and the last four turns,
    each message at most ``limit`` characters (tool results are what grows)."""
    kept = messages if len(messages) <= 6 else messages[:2] + messages[-4:]
    out = []
    for message in kept:
        content = message.get("content")
        if isinstance(content, str) and len(content) > limit:
            message = {**message, "content": content[:limit] + " [...]"}
        out.append(message)
    return out


#: A citation of a source line, ``path:line: words copied from that line`` (``path:line "words"`` too).
_SOURCE_LINE = re.compile(r"\[?(?P<path>[^\s:\[\]]+):(?P<line>[0-9]{1,9})\]?(?::?\s*(?P<quote>.*))?\Z", re.DOTALL)


def _clip(value: Any) -> str:
    return _cut(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str),
                MAX_RESULT_CHARS)


def _source_lines(result: Any) -> list[str] | None:
    """A search's matches as ``path:line: text`` lines, the form a finding cites them in; ``None`` for a result
    that is not a search's."""
    matches = result.get("matches") if isinstance(result, dict) else None
    if not isinstance(matches, list) or not all(isinstance(m, dict) and {"path", "line", "text"} <= m.keys()
                                                for m in matches):
        return None
    return [f"{str(m['path']).removeprefix('./')}:{m['line']}: {' '.join(str(m['text']).split())}"
            for m in matches]


def _shown(result: Any) -> Any:
    """A search's matches as ``path:line: text`` lines (a small model copies a line it was shown; it does not put
    one together from JSON fields); any other result as it is."""
    lines = _source_lines(result)
    if lines is None:
        return result
    more = " (more matches were cut: search for something narrower)" if result.get("truncated") else ""
    return "\n".join(lines) + more if lines else "no line matches"


def _question(prompt: str, title: str) -> str:
    """The question a task's own prompt asks (its first sentence ending with a question mark, after the goal's
    ``Objective:`` paragraph a run puts first), else the objective's, else its title."""
    head, _, own = prompt.partition("\n\n") if prompt.startswith("Objective:") else ("", "", prompt)
    found = re.search(r"[^.?!\n]*\?", own) or re.search(r"[^.?!\n]*\?", head.removeprefix("Objective:"))
    return found[0].strip() if found else title


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " [...]"


def refused_task(exc: BudgetExceededError) -> str | None:
    """The task a refused claim names (its envelope is ``task ID (...)``), or None."""
    envelope = exc.envelope if isinstance(exc.envelope, str) else ""
    kind, _, rest = envelope.partition(" ")
    task_id = rest.split(" ", 1)[0]
    return task_id if kind == "task" and task_id else None


class BuiltinAgent:
    """One agent run over one claimed task."""

    def __init__(
        self, model: ChatModel, plane: PlaneTools, local: LocalTools, settings: AgentSettings,
        trajectory: TrajectoryReporter | None = None, wasi: governed.WasiTools | None = None,
    ) -> None:
        self._model = model
        self._trajectory = trajectory
        self._draft = StepDraft(0)  # the step under way: its replies, for the trajectory
        self._plane = plane
        self._local = local
        self._wasi = wasi
        #: what the model is shown, and every name a reply may use (one outside the profile is refused by name)
        self._offered = governed.offered(TOOLS, settings.profile, wasi)
        self._known = governed.known(wasi, settings.profile)
        if settings.attach_result:
            self._offered, self._known = with_attached(self._offered), with_attached(self._known)
        #: a worker whose finding is the lines it cites, written by the agent (``quoted``)
        self._quoted = settings.finding == QUOTED and settings.role is Role.WORKER
        if self._quoted:
            from swarmyard.agents import quoted  # a quoted run's alone: not imported by every worker's start

            self._offered, self._known = quoted.with_quoted(self._offered), quoted.with_quoted(self._known)
        #: the last tool call carried out and its result: what an attached finding's body is
        self._last_call: tuple[Action, Any] | None = None
        #: the lines the worker's searches returned (``path:line: text``): a finding submitted alone cites them
        self._lines: list[str] = []
        self._settings = settings
        #: when the claim was last renewed (monotonic; the claim comes after this): ``_keep_claim`` counts its
        #: interval from here, across model calls
        self._renewed_at = time.monotonic()
        self._findings_seen: list[str] = []
        self._posts_seen: list[str] = []
        #: SHA-256 of every artifact this agent submitted: its finding cites them (and so carries their score)
        self._artifacts_sent: list[str] = []
        #: the integer score of the last artifact submitted (``None``: unscored, or its submission was refused)
        self._last_score: int | None = None
        self._board: list[Post] = []
        self._me = ""
        self._last_text = ""  # the model's latest non-empty reply text, for a partial finding
        self._tools_run = 0  # tool calls carried out: with the text above, the work a partial finding holds
        self.malformed = 0
        self._evidence: str | None = None  # the board post an attached finding cites
        #: what a finding may not merely restate (the task's prompt) or, for a lead, copy (the findings it read)
        self._prompt = ""
        self._title = ""
        self._read: dict[str, str] = {}
        #: a lead's note on the tasks that reached no result, as its prompt gives it: its synthesis says it too
        self._note = ""
        #: the group's scored attempts, read from its board, when the context is built from them
        self.attempts: list[history.Attempt] = []
        self._history = settings.history if settings.role is Role.WORKER else ""
        self.explorer = (
            Explorer()
            if settings.policy == "explore" and settings.role is Role.WORKER
            else None
        )

    async def run(self) -> AgentOutcome:
        """Claim, work, submit; never raises for a model's mistakes, only (``ProviderError``) for a model that
        failed before the run did any work."""
        try:
            task = await self._plane.claim(self._settings.task_id, model=self._settings.model,
                                           max_tokens=self._settings.max_tokens)
        except BudgetExceededError as exc:
            # Nothing was claimed and nothing can be done: the task stays as it was, for the run to end (it fails
            # the tasks no call fits in). The task the plane named, when it named one, is reported.
            log.warning("claim refused: %s", exc.message)
            return AgentOutcome(Ending.CLAIM_REFUSED, refused_task(exc))
        if task is None:
            return AgentOutcome(Ending.NO_TASK)
        # what a finding may not merely say back: its task (for a lead, the findings' headings too: the demo's
        # lead once answered with one finding's title line)
        self._prompt, self._title = task.prompt, task.title
        if self._settings.synthesis == QUOTED and self._settings.role is Role.LEAD:
            return await self._quoted_synthesis(task)
        messages = [
            {"role": "system", "content": self._system()},
            {"role": "user", "content": await self._brief(task)},
        ]
        if self.explorer is not None:
            # the direction is claimed in the store (never two holders), then posted for peers to read
            if (direction := await self.explorer.start(self._plane, task.title)) is not None:
                await self._post_direction(direction)
            messages[-1]["content"] += self.explorer.brief()
        brief = messages[-1]["content"]
        if self._history:
            self.attempts = history.attempts_on(p.body for p in await self._attempt_posts())
            messages[-1]["content"] = self._with_history(brief)
        ending = Ending.STEP_CAP
        steps = 0
        cut_short = ""  # the model error that ended the run, if one did
        stopped = ""  # the limit the broker named when it refused a call, if it did
        shown = originality.findings_shown(task.prompt) if self._settings.role is Role.LEAD else []
        if self._settings.synthesis == DIGEST and shown and self._settings.max_steps >= 2:
            return await self._digest(task, shown)
        try:
            for steps in range(1, self._settings.max_steps + 1):
                self._draft = StepDraft(steps)
                last = steps == self._settings.max_steps
                if last and steps > 1:
                    # Small models wander; the last step may only submit, so the finding carries what the
                    # model worked out rather than a placeholder.
                    messages.append({"role": "user",
                                     "content": instructions.QUOTED_LAST_STEP if self._quoted else _LAST_STEP})
                action = await self._next_action(messages, only=self._only(steps, last))
                if action is None:
                    await self._step_done(task, None, None, "no usable reply")
                    continue
                if action.tool == FINISH:
                    try:
                        finding_id = await self._submit(action.args)
                    except UnoriginalFindingError as exc:
                        # the plane's own copy check reads the findings whole (the brief has them cut): asked again
                        self.malformed += 1
                        await self._step_done(task, action, exc.to_dict())
                        messages += [{"role": "assistant",
                                      "content": json.dumps({"action": {"tool": action.tool, "args": action.args}})},
                                     {"role": "user", "content": _REASK.format(error=exc.reason)}]
                        continue
                    except UnverifiedCitationError as exc:
                        # a quote the task's files do not hold: asked again with where the words really are
                        self.malformed += 1
                        await self._step_done(task, action, exc.to_dict())
                        messages += [{"role": "assistant",
                                      "content": json.dumps({"action": {"tool": action.tool, "args": action.args}})},
                                     {"role": "user", "content": instructions.CITE_REASK.format(
                                         ref=exc.ref, error=exc.reason) + self._lines_to_cite()}]
                        continue
                    await self._step_done(task, action, {"finding_id": finding_id})
                    return AgentOutcome(Ending.SUBMITTED, task.task_id, finding_id, steps, self.malformed)
                result = await self._run_tool(action)
                self._last_call = (action, result)
                self._lines += [line for line in _source_lines(result) or () if line not in self._lines]
                await self._step_done(task, action, result)
                self._tools_run += 1
                if self._history and action.tool == "submit_artifact" and self._last_score is not None:
                    # the next attempt starts afresh from the brief and the scored attempts the setting keeps
                    messages[:] = [messages[0], {"role": "user", "content": self._with_history(brief)}]
                    continue
                messages.append(
                    {
                        "role": "assistant",
                        "content": json.dumps({"action": {"tool": action.tool, "args": action.args}}),
                    }
                )
                said = f"Result of {action.tool}:\n{_clip(_shown(result))}"
                if self._quoted and _source_lines(result):
                    # the question is put again right after the lines it is to be answered from (a 0.5B model
                    # loses a question asked far above them)
                    said += "\n\n" + instructions.QUOTED_ASK.format(question=_question(task.prompt, task.title))
                messages.append({"role": "user", "content": said})
        except BudgetError as exc:
            log.info("budget stop: %s", exc.message)
            ending = Ending.BUDGET
            stopped = no_result.stopped_by(exc, steps)
        except FencingError:
            return AgentOutcome(Ending.LOST_CLAIM, task.task_id, None, steps, self.malformed)
        except ProviderError as exc:
            where = f"at step {steps} of {self._settings.max_steps}"
            if not self._tools_run and not self._last_text.strip():
                # nothing to submit but a placeholder, which would end the task done with the calls unreported:
                # no finding, so the coordinator counts a failed try and names this error when it gives up
                raise ProviderError(f"stopped on a model error {where}, before any work ({exc.code}): "
                                    f"{exc.message}", retryable=exc.retryable,
                                    upstream_status=exc.upstream_status) from exc
            log.warning("model failed %s: %s", where, exc.message)
            ending = Ending.MODEL_ERROR
            cut_short = f"cut short by a model error {where} ({exc.code}): {exc.message}"[:1000]
        partial = {"title": f"{task.title} (partial)",
                   "body": self._partial_body(task.title, ending, stopped, cut_short)}
        try:
            finding_id = await self._submit(partial)
        except (UnoriginalFindingError, UnverifiedCitationError):
            # a copy, or words that cite no line of the task's files: the run says it reached nothing, and why
            partial["body"] = self._partial_body(task.title, ending, stopped, cut_short, salvage=False)
            finding_id = await self._submit(partial)
        await self._step_done(task, Action(FINISH, partial), {"finding_id": finding_id},
                              f"ended: {ending.value}" + (f"; {cut_short}" if cut_short else ""))
        return AgentOutcome(ending, task.task_id, finding_id, steps, self.malformed)

    async def _digest(self, task: ClaimedTask, shown: list[tuple[str, str, str]]) -> AgentOutcome:
        """The synthesis in parts: for each finding (up to ``max_steps - 1`` of them) the lead's verdict on the
        objective's question (yes, no or unclear, constrained to those three) and one sentence of its own on what
        the finding shows; then the answer, whose decision is the verdicts' tally (``verdicts.answer_sentence``,
        naming the findings it rests on), and the model's reason for it, refused where it says the opposite.

        Why: a small model asked for the whole synthesis at once copies the findings it was shown, and asked for
        its decision in its own words it often turns it round (the demo's 0.5B lead answered "We should not keep
        ... safe" from three findings saying it is). Asked one finding at a time, and for a verdict it can only
        choose, it is mostly right, and the answer cannot say more than its verdicts. Each finding is one step
        (two calls sharing their start), the answer another; a finding's sentence the model cannot give is replaced by
        a fixed note (its verdict still counts and its id is named), a reason it cannot give is left out, and a
        model or budget stop keeps the parts already written.
        """
        from swarmyard.agents import verdicts  # the lead's alone: not imported by a worker's start

        objective = task.prompt.split("\n", 1)[0].removeprefix("Objective:").strip() or task.title
        system = {"role": "system", "content": instructions.DIGEST}
        points: list[tuple[str, str, str, str]] = []  # (finding id, its title, its verdict, the lead's sentence)
        reason: str | None = None
        answer = ""
        steps = 0
        stopped = ""
        budget_stop = False
        try:
            for ref, heading, body in shown[: self._settings.max_steps - 1]:
                steps += 1
                title = heading.rsplit(" (by ", 1)[0]
                ask = [system, {"role": "user", "content": instructions.DIGEST_VERDICT.format(
                    objective=objective, title=title, body=_cut(body, _DIGEST_BODY_CHARS))}]
                verdict = await self._verdict(task, steps, ask, ref)
                # the point is asked after the verdict, in the same conversation (its start is read once)
                # (said back as plain text: a small model shown its own JSON answers the next question in JSON)
                ask += [{"role": "assistant", "content": f"My verdict: {verdict}."},
                        {"role": "user", "content": instructions.DIGEST_POINT}]
                point = await self._digest_part(task, steps, ask, f"point of [{ref}]")
                # a finding whose point the model could not give keeps its verdict: the answer counts every
                # finding it read and names each, with no words of the lead's where it had none of its own
                points.append((ref, title, verdict, point if point is not None else _NO_POINT))
            if points:
                steps += 1
                tally = verdicts.Tally(tuple((ref, verdict) for ref, _, verdict, _ in points))
                answer = verdicts.answer_sentence(tally)
                said = {verdicts.YES: "yes", verdicts.NO: "no", verdicts.MIXED: "mixed: some findings say yes, "
                        "some no", verdicts.UNCLEAR: "unclear"}[tally.overall]
                listed = "\n".join(f"{i}. {title} ({verdict})" + ("" if point == _NO_POINT else f": {point}")
                                    for i, (_, title, verdict, point) in enumerate(points, 1))
                ask = [system, {"role": "user", "content": instructions.DIGEST_ANSWER.format(
                    objective=objective, points=listed, answer=said)}]
                reason = await self._digest_part(task, steps, ask, "reason", against=(tally.overall, said))
        except BudgetError as exc:
            stopped = f"cut short: {no_result.stopped_by(exc, steps)}"
            budget_stop = True
        except ProviderError as exc:
            if not points:
                raise
            stopped = f"cut short by a model error at step {steps} ({exc.code}): {exc.message}"[:1000]
        except FencingError:
            return AgentOutcome(Ending.LOST_CLAIM, task.task_id, None, steps, self.malformed)
        reasons = "\n".join(verdicts.point_line(ref, verdict, point) for ref, _, verdict, point in points)
        parts = [f"{answer} {reason}" if answer and reason else answer,
                 f"{'From the findings' if answer else 'No overall answer was reached; what each finding means'}:"
                 f"\n{reasons}" if reasons else "",
                 self._note,
                 f"({stopped})" if stopped else ""]
        body = "\n\n".join(p for p in parts if p)
        if not points:
            body = no_result.placeholder(task.title, "no finding could be read into a point of its own")
        args: dict[str, Any] = {"title": "synthesis", "body": body, "cite": [ref for ref, _, _, _ in points]}
        try:
            finding_id = await self._submit(args)
        except UnoriginalFindingError:
            # the plane reads the findings whole: keep the answer the verdicts make and each finding's verdict, and
            # leave out the words the plane found copied (the reason and the points)
            listed = "\n".join(verdicts.point_line(ref, verdict, "(its point is left out: it copied its finding)")
                                for ref, _, verdict, _ in points)
            args["body"] = (f"{answer}\n\nFrom the findings:\n{listed}" if answer and listed
                            else answer or no_result.placeholder(task.title, "every point copied its finding"))
            finding_id = await self._submit(args)
        ending = Ending.SUBMITTED if answer and not stopped else (Ending.BUDGET if budget_stop
                                                                  else Ending.MODEL_ERROR if stopped
                                                                  else Ending.STEP_CAP)
        self._draft = StepDraft(steps + 1)
        await self._step_done(task, Action(FINISH, args), {"finding_id": finding_id},
                              f"digest of {len(points)} of {len(shown)} findings"
                              + ("" if answer else "; no answer") + ("" if reason or not answer else "; no reason")
                              + (f"; {stopped}" if stopped else ""))
        return AgentOutcome(ending, task.task_id, finding_id, steps, self.malformed)

    def _quoted_finding(self, action: Action) -> Action:
        """The finding a quoted worker's model chose: its task's title and the lines it cited among those its
        searches returned, each quoted whole, written as ``"the line" (path:line)`` (``quoted.finding``). A line is
        given as the search returned it (``path:line: text``) or by its ``path:line`` alone (its words are then
        the search's)."""
        from swarmyard.agents import quoted

        cite = action.args.get("cite")
        searched = dict(line.split(": ", 1) for line in self._lines if ": " in line)
        cited: list[tuple[str, str]] = []
        for given in [str(c).strip() for c in cite] if isinstance(cite, list) else []:
            m = _SOURCE_LINE.match(given)
            ref = f"{m['path']}:{m['line']}" if m is not None else given
            if ref in searched:  # a line the search returned is quoted whole, whatever part of it was given
                cited.append((ref, searched[ref]))
            # any other is left out (none left: the model is asked again): part of a line it was not shown can
            # drop the line's "never" and pass every check ("the whole environment" of "never the whole ...")
        body = quoted.finding(cited)  # a quote too short to check is the plane's to refuse
        return Action(FINISH, {"title": self._title or "finding", "body": body,
                               "cite": [f"{ref}: {quote}" for ref, quote in cited]})

    async def _quoted_synthesis(self, task: ClaimedTask) -> AgentOutcome:
        """The synthesis with no model call (``synthesis = "quoted"``): the objective, then per finding the lines
        the plane checked for it and its id (``quoted.synthesis``)."""
        from swarmyard.agents import quoted

        self._draft = StepDraft(1)
        await self._brief(task)  # the findings' ids (cited), the note on tasks that reached nothing
        shown = originality.findings_shown(task.prompt)
        objective = task.prompt.split("\n", 1)[0].removeprefix("Objective:").strip() or task.title
        body = (quoted.synthesis(objective, shown) if shown
                else no_result.placeholder(task.title, "no finding was submitted to quote"))
        args: dict[str, Any] = {"title": "synthesis", "body": body, "cite": [ref for ref, _, _ in shown]}
        try:
            finding_id = await self._submit(args)
        except FencingError:
            return AgentOutcome(Ending.LOST_CLAIM, task.task_id, None, 0, self.malformed)
        await self._step_done(task, Action(FINISH, args), {"finding_id": finding_id},
                              f"quoted {len(shown)} findings: no model call")
        return AgentOutcome(Ending.SUBMITTED, task.task_id, finding_id, 0, self.malformed)

    async def _verdict(self, task: ClaimedTask, step: int, messages: list[dict[str, Any]], ref: str) -> str:
        """The lead's verdict on one finding, chosen from ``verdicts.VERDICTS`` (the answer's schema is that enum,
        so a model that follows it cannot answer anything else); a reply that holds none, from a model that
        ignores the schema, counts as unclear (and as a malformed reply)."""
        from swarmyard.agents import verdicts  # the lead's alone: not imported by a worker's start

        self._draft = StepDraft(step)
        asked_ms = now_ms()
        reply = await self._reply(messages, frozenset({FINISH}), {FINISH: verdicts.spec()})
        self._draft.reply(reply, now_ms() - asked_ms)
        verdict = verdicts.read(reply.text, reply.tool_calls)
        note = None
        if verdict is None:
            self.malformed += 1
            self._draft.replies[-1]["malformed"] = "no verdict"
            verdict, note = verdicts.UNCLEAR, "no verdict given: counted as unclear"
        await self._step_done(task, None, {"part": f"verdict of [{ref}]", "verdict": verdict}, note)
        return verdict

    async def _digest_part(self, task: ClaimedTask, step: int, messages: list[dict[str, Any]], what: str,
                           against: tuple[str, str] | None = None) -> str | None:
        """One part of a digest, asked as plain text (a small model made to answer in a tool's JSON echoes what it
        read), checked as a submission is and asked again with the reason, at most ``max_reasks`` times.
        ``against`` (the tally's overall verdict and how the model was told it): a part that states the opposite
        decision (``verdicts.contradicts``) is refused too, and left out if the model keeps saying it."""
        from swarmyard.agents import verdicts  # the lead's alone: not imported by a worker's start

        self._draft = StepDraft(step)
        extra: list[dict[str, Any]] = []
        said = ""
        for _ in range(self._settings.max_reasks + 1):
            asked_ms = now_ms()
            reply = await self._reply(messages + extra, _TEXT_ONLY)
            self._draft.reply(reply, now_ms() - asked_ms)
            said = _said(reply)
            # not the prompt: an answer names the objective its prompt holds; the findings it read are the check
            why = originality.problem(said, read=self._read) if said else "the answer is empty"
            if why is None and said.startswith("{"):
                why = "it is JSON, not a sentence"
            if why is None and against is not None and verdicts.contradicts(said, against[0]):
                why = f"it says the opposite of the findings' answer ({against[1]})"
                self.malformed += 1
                self._draft.replies[-1]["malformed"] = why[:1000]
                extra = [{"role": "assistant", "content": said},
                         {"role": "user", "content": instructions.DIGEST_AGAINST.format(answer=against[1])}]
                continue
            if why is None:
                await self._step_done(task, None, {"part": what, "text": said})
                return said
            self.malformed += 1
            self._draft.replies[-1]["malformed"] = why[:1000]
            extra = [{"role": "assistant", "content": said or "(empty)"},
                     {"role": "user", "content": instructions.DIGEST_REASK.format(error=why)}]
        await self._step_done(task, None, None, f"no usable {what}")
        return None

    async def _step_done(self, task: ClaimedTask, action: Action | None, result: Any,
                         note: str | None = None) -> None:
        """Report the step under way to the trajectory (its replies were gathered as they came)."""
        if self._trajectory is not None:
            await self._trajectory.report(self._draft, task_id=task.task_id, fencing_token=task.fencing_token,
                                          action=(action.tool, action.args) if action else None,
                                          result=result, note=note)

    def _partial_body(self, title: str, ending: Ending, stopped: str, cut_short: str, *, salvage: bool = True) -> str:
        """What a run that did not submit has: the model's last words (a submission it began and could not
        finish, or whatever it said), saying why it stopped when a model error stopped it; a worker whose context
        is its scored attempts has its best one. With none of these, the placeholder naming the limit that ran
        out: ``stopped`` (the broker's refusal, said by ``no_result.stopped_by``) or the step cap."""
        if salvage and self.attempts and not cut_short:
            top = history.best(self.attempts, 1)[0]
            return f"The best attempt found: [score {top.score}] {top.content}"
        salvaged = salvage_submission(self._last_text)
        # a quoted finding holds no words of the model's: nor does what it ends with
        said = (salvaged["body"] if salvaged else self._last_text.strip()) if salvage and not self._quoted else ""
        if said and originality.problem(said, prompt=self._prompt, read=self._read) is not None:
            said = ""  # a loop, the prompt said back or a copied finding is no result: say there is none
        if cut_short:
            return f"{said}\n\n({cut_short})" if said else no_result.placeholder(title, cut_short)
        if said:
            return str(said)
        if ending is Ending.BUDGET and stopped:
            return no_result.placeholder(title, stopped)
        return no_result.placeholder(title, no_result.step_cap(self._settings.max_steps))

    async def _brief(self, task: ClaimedTask) -> str:
        lead = self._settings.role is Role.LEAD
        # a small model copies what it read last: the lead's instructions come after what it is to read
        parts = [f"Task: {task.title}"] + ([] if lead else [task.prompt])
        try:
            posts = list((await self._plane.board_read(limit=20)).posts)
        except SwarmyardError as exc:
            posts = []
            log.info("board_read failed: %s", exc.message)
        self._board = posts
        # where the context is built from scored attempts, they come in the history block, as many as it keeps
        shown = [p for p in posts if not (self._history and history.attempts_on([p.body]))]
        if posts:
            self._posts_seen = [str(p.seq) for p in posts]
        if shown:
            parts.append(
                "Board:\n"
                + "\n".join(f"[post {p.seq}] {p.author}: {_cut(p.body, _POST_CHARS)}" for p in shown[-10:])
            )
        if lead:
            # the coordinator hands the lead the findings in its task; those ids count as seen, and only
            # findings the task does not hold yet are added
            self._findings_seen = re.findall(r"\[(fnd_[0-9a-z]+)\]", task.prompt)
            self._note = grounding.note_in(task.prompt) or ""
            found = (await self._plane.read_findings(limit=200)).findings
            # what it may not copy: the findings its prompt shows (its group's own are none) and any it read
            self._read = {**originality.findings_in(task.prompt), **{f.id: f.body for f in found}}
            more = [(f.id, f.title, f.body) for f in found if f.id not in self._findings_seen]
            self._findings_seen += [ref for ref, _, _ in more]
            if more:
                parts.append("Findings:\n" + findings_block(more))
            if self._wasi is not None:
                await self._write_findings_table(
                    [(ref, title, self._read.get(ref, body))
                     for ref, title, body in originality.findings_shown(task.prompt)] + more)
            parts.append(task.prompt)
        return "\n\n".join(p for p in parts if p)

    async def _keep_claim(self) -> None:
        """Renew the lease while a (possibly slow) model call is in flight: the worker is alive, just waiting.

        The interval counts from the last renewal, not from this call's start: each call starts a keeper and
        ends it, so a run of calls each shorter than the interval (a lead's ten 1.5 s answers on a 15 s
        lease) never renewed, and the claim lapsed in the middle of the work."""
        while True:
            await asyncio.sleep(max(0.0, self._renewed_at + self._settings.heartbeat_s - time.monotonic()))
            self._renewed_at = time.monotonic()
            try:
                await self._plane.heartbeat()
            except SwarmyardError as exc:
                log.info("heartbeat failed: %s", exc.message)
                return

    async def _reply(self, messages: list[dict[str, Any]], only: frozenset[str] | None,
                     specs: dict[str, ToolSpec] | None = None) -> ModelReply:
        """One reply (``specs`` narrows the offered tools' arguments; by default, ``_specs``). A conversation too
        long for the model is compacted and re-asked; a failure in passing is re-asked after a growing wait;
        anything else (or more of the same) is raised."""
        keeper = asyncio.create_task(self._keep_claim())
        compacted = retries = 0
        specs = self._specs(only) if specs is None else specs
        try:
            while True:
                try:
                    asked = messages if not compacted else _compact(messages, _COMPACT_LIMITS[compacted - 1])
                    if specs:
                        return await self._model.reply(asked, only=only, specs=specs)
                    return await self._model.reply(asked, only=only)
                except ContextLengthError as exc:
                    if compacted == len(_COMPACT_LIMITS):
                        raise ProviderError(f"the conversation does not fit even compacted: {exc.message}") from exc
                    compacted += 1
                    log.info("conversation too long for the model; compacted to %d characters a message",
                             _COMPACT_LIMITS[compacted - 1])
                except ProviderError as exc:
                    if not exc.retryable or retries == self._settings.max_retries:
                        raise
                    retries += 1
                    log.info("model call failed (%s); asking again", exc.message)
                    await asyncio.sleep(self._settings.retry_backoff_s * 2 ** (retries - 1))
        finally:
            keeper.cancel()

    async def _next_action(self, messages: list[dict[str, Any]],
                           only: frozenset[str] | None = None) -> Action | None:
        """Ask the model; re-ask on malformed output at most ``max_reasks`` times (then ``None``)."""
        extra: list[dict[str, Any]] = []
        for _ in range(self._settings.max_reasks + 1):
            asked_ms = now_ms()
            reply = await self._reply(messages + extra, only)
            self._draft.reply(reply, now_ms() - asked_ms)
            self._last_text = reply.text or self._last_text
            try:
                action = self._parse(reply, only)
                if action.tool == FINISH and self._settings.attach_result:
                    # the body is the tool's, not the model's: nothing of the model's to check
                    return Action(FINISH, {**action.args, "body": self._attached()})
                if action.tool == FINISH and self._quoted:
                    # the model chose a verdict and lines; the finding is written from them, and the plane checks
                    # every quote against its line (a reply without either is asked again)
                    return self._quoted_finding(action)
                if action.tool == FINISH:
                    # a loop, the task said back, or (a lead) a finding copied: refused, and the model asked again
                    why = originality.problem(str(action.args.get("body", "")), prompt=self._prompt, read=self._read)
                    if why is not None:
                        self.malformed += 1
                        raise InvalidInputError(why, field="body")
                return action
            except InvalidInputError as exc:
                self._draft.replies[-1]["malformed"] = exc.message[:1000]
                extra = [
                    {"role": "assistant", "content": reply.text[:MAX_RESULT_CHARS] or "(empty)"},
                    {"role": "user", "content": _REASK.format(error=exc.message)},
                ]
        return None

    def _parse(self, reply: ModelReply, only: frozenset[str] | None) -> Action:
        """The action in a reply; a malformed one is counted, and a submission cut off at ``max_tokens`` is
        salvaged (asked again, a small model only writes as long again)."""
        try:
            if reply.tool_calls:
                return parse_tool_call(*reply.tool_calls[0], self._known, choices=self._offered)
            return parse_reply(reply.text, self._known, choices=self._offered)
        except InvalidInputError:
            self.malformed += 1
            named = bool(reply.tool_calls) and reply.tool_calls[0][0] == FINISH
            cut = reply.tool_calls[0][1] if named else reply.text
            salvaged = salvage_submission(cut)
            if salvaged is not None and (named or FINISH in cut or only == frozenset({FINISH})):
                return Action(FINISH, salvaged)
            raise

    async def _run_tool(self, action: Action) -> Any:
        # a command may run far longer than a lease (up to its exec timeout): the claim is kept meanwhile, as
        # during a model call
        keeper = asyncio.create_task(self._keep_claim())
        try:
            return await self._run_tool_kept(action)
        finally:
            keeper.cancel()

    async def _run_tool_kept(self, action: Action) -> Any:
        args = action.args
        try:
            governed.refuse(action.tool, self._settings.profile)  # a typed refusal the model is shown
            if self._wasi is not None and action.tool in self._wasi:
                return await self._wasi.call(action.tool, args)
            match action.tool:
                case "shell":
                    return await self._local.shell(str(args["command"]))
                case "read_file":
                    return self._local.read_file(str(args["path"]))
                case "write_file":
                    return self._local.write_file(str(args["path"]), str(args["content"]))
                case "board_post":
                    posted, read = await self._plane.answer(board_post_call(str(args["body"]), PostKind.PROGRESS))
                    # the agent's own post is citable too: a finding often rests on the notes it posted
                    self._posts_seen.append(str(read.post.seq))
                    return posted
                case "board_read":
                    return (await self._plane.answer(board_read_call(limit=20)))[0]
                case "read_findings":
                    return (await self._plane.answer(read_findings_call(limit=20)))[0]
                case "submit_artifact":
                    return await self._submit_artifact(str(args["content"]))
                case _:
                    return f"unknown tool {action.tool}"
        except (BudgetError, FencingError):
            raise
        except SwarmyardError as exc:
            # a tool's refusal is information for the model, not the end of the run
            return f"error ({exc.code}): {exc.message}"

    async def _post_direction(self, direction: str) -> None:
        post = (await self._plane.board_post(direction_post(direction), PostKind.DIRECTION)).post
        self._me = post.author
        self._posts_seen.append(str(post.seq))

    async def _attempt_posts(self) -> tuple[Post, ...]:
        """The group's board as far as attempts go (its first 500 posts; a read that fails reads none)."""
        try:
            return (await self._plane.board_read(limit=500)).posts
        except (BudgetError, FencingError):
            raise
        except SwarmyardError as exc:
            log.info("board_read failed: %s", exc.message)
            return ()

    def _with_history(self, brief: str) -> str:
        block = history.context_block(self._history, self.attempts, self._settings.history_top_k)
        return "\n\n".join(p for p in (brief, history.INSTRUCTIONS, block) if p)

    async def _submit_artifact(self, content: str) -> Any:
        """Store one attempt; under ``explore`` its score drives staying, switching or adopting; where the
        context is built from scored attempts, a scored one is posted for the group and the group's are read."""
        self._last_score = None
        result, stored = await self._plane.answer(submit_artifact_call(content.encode(), "text/plain"))
        self._artifacts_sent.append(stored.artifact.sha256)
        self._last_score = score = stored.scored
        if self._history and score is not None:
            await self._plane.board_post(history.attempt_post(score, content), PostKind.PROGRESS)
            self.attempts = (history.attempts_on(p.body for p in await self._attempt_posts())
                             or [history.Attempt(score, content)])
        if self.explorer is None:
            return result
        # the plane has already moved the worker (switch or adopt) in the store; follow it and say so
        note = self.explorer.after_attempt(stored.direction)
        if note is None or self.explorer.direction is None:
            return result
        await self._post_direction(self.explorer.direction)
        return {**result, "note": note}

    def _citations(self, cite: object) -> list[dict[str, str]]:
        refs = [str(c) for c in cite] if isinstance(cite, list) else []
        out = []
        for ref in refs:
            if (line := _SOURCE_LINE.match(ref.strip())) is not None:
                # a source line as a search returned it, path:line: text; the plane checks the text is there
                out.append({"kind": "source", "ref": f"{line['path']}:{line['line']}", "quote": line["quote"] or ""})
                continue
            ref = ref.strip().strip("[]").removeprefix("post ").strip()
            if ref in self._findings_seen:
                out.append({"kind": "finding", "ref": ref})
            elif ref in self._posts_seen:
                out.append({"kind": "post", "ref": ref})
        if self._settings.role is Role.LEAD:
            # a synthesis rests on every finding it was shown, even when a small model names only some
            out += [{"kind": "finding", "ref": ref} for ref in self._findings_seen]
        # a finding rests on the attempts its agent submitted: citing them gives it their best score
        out += [{"kind": "artifact", "ref": sha} for sha in self._artifacts_sent]
        unique: dict[tuple[str, str], dict[str, str]] = {}
        for citation in out:  # a model may cite the same thing twice; a finding lists it once
            unique.setdefault((citation["kind"], citation["ref"]), citation)
        return list(unique.values())

    def _system(self) -> str:
        """The system prompt, with the flow's steps and what an attached finding is, where the run sets them."""
        text = _SYSTEM[self._settings.role].format(tools=", ".join(self._offered))
        if self._settings.flow:
            text += " " + instructions.FLOW.format(steps=", then ".join(self._settings.flow))
        if self._settings.attach_result:
            text += " " + instructions.ATTACHED
        if self._quoted:
            text += " " + instructions.QUOTED
        return text

    def _only(self, step: int, last: bool) -> frozenset[str] | None:
        """The tools step ``step`` offers: the flow's, else only ``submit_finding`` on the last, else all."""
        if step <= len(self._settings.flow):
            return frozenset({self._settings.flow[step - 1]})
        return frozenset({FINISH}) if last else None

    def _specs(self, only: frozenset[str] | None) -> dict[str, ToolSpec]:
        """A worker's finding asked for alone, after searches that returned lines, may cite only those lines,
        as they were returned (constrained decoding: the model chooses the lines, it cannot misspell them). A
        quoted finding is a verdict and lines whenever it is offered (the lines a search returned, once one has)."""
        if self._quoted and (only is None or FINISH in only):
            from swarmyard.agents import quoted

            return {FINISH: quoted.spec(self._lines[-_CITABLE:])}
        if (only != frozenset({FINISH}) or not self._lines or self._settings.role is not Role.WORKER
                or self._settings.attach_result):
            return {}
        return {FINISH: citing(self._lines[-_CITABLE:])}

    def _lines_to_cite(self) -> str:
        """The lines the searches returned, for a re-ask after a refused citation."""
        if not self._lines:
            return ""
        return " The lines your searches returned, to cite as they are:\n" + "\n".join(self._lines[-_CITABLE:])

    def _attached(self) -> str:
        """The last tool result as a finding's body: a list (or a tool's ``value`` list, or a query's rows) one
        item a line, anything else as JSON; no tool run is said."""
        if self._last_call is None:
            return "No tool was run, so there is no result to report."
        result = self._last_call[1]
        if isinstance(result, dict) and isinstance(result.get("rows"), list):
            result = [", ".join(str(v) for v in row) if isinstance(row, list) else row for row in result["rows"]]
        elif isinstance(result, dict) and "value" in result:
            result = result["value"]
        if isinstance(result, list):
            lines = [item if isinstance(item, str) else json.dumps(item, ensure_ascii=False) for item in result]
            return "\n".join(lines) if lines else "(empty: the tool found nothing)"
        return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)

    async def _post_evidence(self) -> None:
        """The tool call an attached finding rests on, posted whole (its arguments and result) so the finding
        cites it."""
        if self._last_call is None:
            return
        action, result = self._last_call
        body = _cut(f"{action.tool} {json.dumps(action.args, ensure_ascii=False)} -> "
                    f"{json.dumps(result, ensure_ascii=False, default=str)}", _EVIDENCE_CHARS)
        try:
            post = (await self._plane.board_post(body, PostKind.PROGRESS)).post
        except (BudgetError, FencingError):
            raise
        except SwarmyardError as exc:
            log.info("board_post of the evidence failed: %s", exc.message)
            return
        self._posts_seen.append(str(post.seq))
        self._evidence = str(post.seq)

    async def _write_findings_table(self, findings: list[tuple[str, str, str]]) -> None:
        """``findings.csv`` in the working folder (finding, title, line: a row a line of each body), so a lead's
        WASI tools can merge what the findings say (a query over a table) instead of a model retyping it."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(("finding", "title", "line"))
        for ref, title, body in findings:
            for line in body.splitlines():
                if line.strip():
                    writer.writerow((ref, title, line.strip()))
        self._local.write_file(FINDINGS_TABLE, out.getvalue())

    async def _submit(self, args: dict[str, Any]) -> str | None:
        title = str(args.get("title") or "finding")[:200]
        body = str(args.get("body") or "").strip() or title
        if self._note and not no_result.is_placeholder(body) and grounding.note_in(body) is None:
            body = f"{body}\n\n{self._note}"  # which tasks reached nothing, as the store says: never left out
        cite = list(args.get("cite") or []) if isinstance(args.get("cite"), list) else []
        if self._settings.attach_result and self._last_call is not None and self._evidence is None:
            await self._post_evidence()
        if self._evidence is not None:
            cite.append(self._evidence)
        if self._settings.synthesis_artifact and self._settings.role is Role.LEAD:
            await self._submit_artifact(body)  # scored by the run's evaluator; the synthesis cites it
        args = {**args, "cite": cite}
        # the citations as the agent writes them (a quote only where it has one), not as ``Citation.to_dict``
        submitted = await self._plane.run(ToolCall(
            FINISH, {"title": title, "body": body, "citations": self._citations(args.get("cite"))}, FindingResult))
        return submitted.finding.id
