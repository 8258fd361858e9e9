"""Drills on the text stock Claude Code and Codex really send: the `claude_code_stock` and `codex_stock`
shapes of `smol-agent`.

The `claude_code` and `codex` shapes of models/agent_drills.py are the two harnesses' structure in short
synthetic wording. A stock binary's request reads differently, and a policy drilled on the short form
does not carry over: through stock Codex 0.171 it wrote Agents SDK handoffs (`transfer_to_<word>`) where
`spawn_agent` was offered, and through stock Claude Code 2.1.332 it echoed the `<system-reminder>`
notification instead of answering from it. These shapes are cut from the requests those versions sent,
in the chat form the gateway hands to the template (models/harness_text/*.chat.json, written by
`python -m cli.harness_chat` and checked against the gateway by tests/models/test_stock_drills.py),
with the user's own parts drawn:

- Claude Code: the lead's system prompt (after Claude Code's fixed first line), the user's request, the
  agent types listed in the environment message, the `Agent` calls, then either the subagents'
  reports handed back at once, or "Async agent launched" results, a short line to the user and the
  `<task-notification>` turn; the answer repeats the reports. A subagent's own request (its definition's
  prompt under Claude Code's subagent notes, the lead's prompt as its user turn) trains its answer.
- Codex: the developer instructions, the user's request (naming helpers that are not tools, as users
  do), the tools grove's launcher leaves on, `spawn_agent` calls with a `message`, `wait_agent` on the
  ids they return, the `<subagent_notification>` turn and the answer; a subagent's request trains its
  answer.

Every literal replaced in a captured text is checked to be there when the texts load, so a new capture
that moved it fails loudly instead of drilling a half-substituted request. Pure; standard library only.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from models.agent_drills import (
    SHAPES,
    AgentCase,
    AgentDrillWriter,
    Offer,
    _call,
    _calls,
    offer_of,
)

STOCK_SHAPES: tuple[str, ...] = ("claude_code_stock", "codex_stock")
ALL_SHAPES: tuple[str, ...] = (*SHAPES, *STOCK_SHAPES)
TEXT_DIR = Path(__file__).parent / "harness_text"
CLAUDE_CODE_TEXT = TEXT_DIR / "claude_code_2_1_332.chat.json"
CODEX_TEXT = TEXT_DIR / "codex_0_171_0.chat.json"

CC_HEAD = "You are a Claude agent, built on Anthropic's Claude Agent SDK.\n\n"
# what the captured launch put where the user's own text goes (models/harness_text/claude_code_2_1_332.json)
_CC_LEAD_PROMPT = (
    "You are the lead. Give each word the user lists to its own worker with the Agent tool (subagent_type "
    "worker, the word as the prompt, run_in_background false), all at once. When the workers answer, reply "
    "with their words."
)
_CC_WORKER_PROMPT = "You are a worker. Reply with the word you are given."
_CC_FOLDER = "/tmp/grove-capture/harness/3f9a1c07d2e4b658/project"
_CC_LISTING = "- worker: Repeats the word it is given. (Tools: All tools)"
_CC_DATE = "Today's date is 2026-12-07."
# the captured notification's task id, tool-use id, summary and result
_CC_NOTIFIED = (">ad441bcc167dd2914<", ">toolu_01A<", 'Agent "Repeat word one" finished', ">zorblat<")
_CODEX_OVERRIDE = (
    "- `grove`: grove policy Reasoning efforts: low, medium (default), high, xhigh. Service tiers: priority."
)
_CODEX_SPAWN_ID = "01a2503a-71ff-7302-be90-b85017c082ab"
# the tools grove's Codex launcher turns off (harnesses/codex.py: no shell, no image viewer, nobody to ask)
_CODEX_OPTIONAL = ("exec_command", "write_stdin", "request_user_input", "view_image")


StockEnv = tuple[dict[str, Any], list[dict[str, Any]]]  # a lead's system message and its tools


class StockTextError(ValueError):
    """A captured text no longer holds a literal the drills replace (a new capture moved it)."""


def _cut(text: str, literal: str, where: str) -> tuple[str, str]:
    """The text before and after the one occurrence of `literal`."""
    if text.count(literal) != 1:
        raise StockTextError(
            f"{where}: expected exactly one {literal[:60]!r} in the captured text, found "
            f"{text.count(literal)}; rerun `python -m cli.harness_chat` on a capture that keeps it"
        )
    before, _, after = text.partition(literal)
    return before, after


@cache
def _requests(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text())["requests"])


class ClaudeCodeText:
    """The pieces of Claude Code 2.1.332's requests with the user's parts cut out."""

    def __init__(self) -> None:
        r = _requests(CLAUDE_CODE_TEXT)
        lead = r["lead_first"]["messages"]
        if lead[0]["content"] != CC_HEAD + _CC_LEAD_PROMPT:
            raise StockTextError(f"{CLAUDE_CODE_TEXT.name}: the lead's system prompt is not the launch's")
        self.tools: list[dict[str, Any]] = r["lead_first"]["tools"]
        env = lead[2]["content"]
        head, rest = _cut(env, _CC_FOLDER, "lead environment")
        middle, tail = _cut(rest, _CC_LISTING, "lead environment")
        self.env_parts = (head, middle, _cut(tail, _CC_DATE, "lead environment")[0])
        worker = r["worker_first"]["messages"]
        self.worker_notes = _cut(worker[0]["content"], CC_HEAD + _CC_WORKER_PROMPT, "worker system")[1]
        wenv = worker[2]["content"]
        whead, wrest = _cut(wenv, _CC_FOLDER, "worker environment")
        self.worker_env_parts = (whead, _cut(wrest, _CC_DATE, "worker environment")[0])
        handback = r["lead_resume"]["messages"][4]["content"]
        self.handback_head = _cut(handback, "\n  zorblat\nagentId: ", "hand-back")[0]
        notified = r["lead_notified"]["messages"]
        self.launched = notified[4]["content"]
        _cut(self.launched, "agentId: ad441bcc167dd2914 ", "async launch")
        reminders = notified[7]["content"]
        first, sep, _ = reminders.partition("</system-reminder>")
        self.reminder = first + sep
        after_first = _cut(reminders, self.reminder, "notification")[1]
        self.reminder_sep = after_first.partition("<system-reminder>")[0]  # between two notifications
        for literal in _CC_NOTIFIED:
            _cut(self.reminder, literal, "notification")

    def env(self, folder: str, listing: str | None, date: str) -> str:
        if listing is None:
            head, tail = self.worker_env_parts
            return head + folder + tail + date
        head, middle, tail = self.env_parts
        return head + folder + middle + listing + tail + date

    def handback(self, report: str, agent_id: str, tokens: int, ms: int) -> str:
        indented = "\n".join("  " + line for line in report.split("\n"))
        return (
            f"{self.handback_head}\n{indented}\nagentId: {agent_id}\n<usage>subagent_tokens: {tokens}\n"
            f"tool_uses: 0\nduration_ms: {ms}</usage>"
        )

    def launch(self, agent_id: str) -> str:
        return self.launched.replace("ad441bcc167dd2914", agent_id)

    def notification(self, agent_id: str, tool_use_id: str, description: str, result: str) -> str:
        text = self.reminder
        values = (f">{agent_id}<", f">{tool_use_id}<", f'Agent "{description}" finished', f">{result}<")
        for literal, value in zip(_CC_NOTIFIED, values, strict=True):
            text = text.replace(literal, value)
        return text


class CodexText:
    """The pieces of Codex 0.171.0's requests: the lead's and a subagent's tools."""

    def __init__(self) -> None:
        r = _requests(CODEX_TEXT)
        self.lead_tools: list[dict[str, Any]] = r["agents_lead_first"]["tools"]
        self.sub_tools: list[dict[str, Any]] = r["agents_subagent_first"]["tools"]
        spawn = next(t for t in self.lead_tools if t["function"]["name"] == "spawn_agent")
        self.spawn_parts = _cut(spawn["function"]["description"], _CODEX_OVERRIDE, "spawn_agent")
        after = r["agents_lead_after_wait"]["messages"]
        self.spawned = after[3]["content"].replace(_CODEX_SPAWN_ID, "{id}")
        if self.spawned != '{"agent_id":"{id}","nickname":"Euler"}':
            raise StockTextError(
                f"{CODEX_TEXT.name}: spawn_agent's output changed shape: {after[3]['content']}"
            )


# The users' own text is drawn from wordings of this module's own; none is bench/harness_drive.py's,
# whose configuration must stay one no drill used.
_CC_LEADS = (
    "You run a team of subagents. Start the agent type that fits each part of the request with the Agent "
    "tool; when their reports arrive, pass them on.",
    "You are the lead. Give each job the user asks for to its agent with the Agent tool, then reply with "
    "what the agents found.",
    "You are {name}, a lead agent. Delegate with the Agent tool (run_in_background false) and answer with "
    "the results.",
    "Answer the user. Start a subagent with the Agent tool for each task, all at once; when they report, "
    "reply with their reports.",
)
_CC_ROLES = (
    "Answers questions about {w}.",
    "Researches {w} topics.",
    "Checks facts on {w}.",
    "Summarises {w} documents.",
)
_CODEX_LEADS = (
    "Split the request into jobs and hand each to a sub-agent with spawn_agent (the job as its message). "
    "Call wait_agent on their ids, then reply with their answers.",
    "You are a coding agent. Use the tools, then answer briefly.",
    "You are the {name} lead. Spawn a subagent for each task with spawn_agent, wait for it, then report "
    "its answer.",
    "Delegate every task to a sub-agent (spawn_agent), then wait_agent, then answer with the results.",
)
_CODEX_OVERRIDES = (
    _CODEX_OVERRIDE,
    "- `grove`: the policy grove trains, served by the episode's gateway",
    "- `{name}`: {name} policy Reasoning efforts: low, medium (default), high.",
)
_LAUNCH_LINES = (
    "I started {n}; their results will follow.",
    "Launched {n}. Waiting for the results.",
    "{n} started in the background.",
)


class StockDrills:
    """Draws the two stock shapes from an AgentDrillWriter's stream (its names, tasks and answers)."""

    def __init__(self, writer: AgentDrillWriter) -> None:
        self.w = writer
        self.cc = ClaudeCodeText()
        self.codex = CodexText()

    def _date(self) -> str:
        rng = self.w.rng
        return f"Today's date is {rng.randint(2024, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}."

    def _folder(self) -> str:
        rng = self.w.rng
        return (
            rng.choice(("/tmp/grove-", "/work/", "/home/"))
            + "/".join(self.w.made_up() for _ in range(rng.randint(1, 3)))
            + rng.choice(("/project", "", "/repo"))
        )

    def _agent_id(self) -> str:
        return "a" + self.w.hex_id(16)

    def env(self, shape: str) -> StockEnv:
        """A stock shape's system message and tools: what a group of its cases shares as a prefix."""
        return self.claude_code_env() if _is_claude_code(shape) else self.codex_env()

    def case(self, shape: str, env: StockEnv | None = None) -> AgentCase:
        return self.claude_code_stock(env) if _is_claude_code(shape) else self.codex_stock(env)

    # -- Claude Code

    def claude_code_env(self) -> StockEnv:
        """The lead's system message and tools: what a group of cases shares as its prefix."""
        w = self.w
        lead = w.rng.choice(_CC_LEADS).format(name=w.made_up())
        return {"role": "system", "content": CC_HEAD + lead}, self.cc.tools

    def claude_code_stock(self, env: StockEnv | None = None) -> AgentCase:
        w, rng = self.w, self.w.rng
        system, tools = env or self.claude_code_env()
        agents = w.distinct(lambda: w.agent_name("-"), rng.randint(1, 4))
        described = {a: rng.choice(_CC_ROLES).format(w=w.made_up()) for a in agents}
        listing = "\n".join(f"- {a}: {d} (Tools: All tools)" for a, d in sorted(described.items()))
        text, pairs, mention = w.delegations(agents)
        background = rng.random() < 0.6
        calls = []
        for agent, task in pairs:
            arguments: dict[str, Any] = {
                "description": task[:40].capitalize(),
                "prompt": task.capitalize() + ".",
                "subagent_type": agent,
            }
            if not background and rng.random() < 0.5:
                arguments["run_in_background"] = False
            calls.append(_call("Agent", arguments))
        folder, date = self._folder(), self._date()
        call = [
            system,
            {"role": "user", "content": text},
            {"role": "system", "content": self.cc.env(folder, listing, date)},
            _calls(calls),
        ]
        results = [w.answer_text() for _ in pairs]
        ids = [self._agent_id() for _ in pairs]
        tool_ids = [f"call_{w.hex_id(16)}_{i}" for i in range(len(pairs))]
        final = list(call)
        if background:
            final += [{"role": "tool", "content": self.cc.launch(i)} for i in ids]
            names = " and ".join(a for a, _ in pairs)
            final.append({"role": "assistant", "content": rng.choice(_LAUNCH_LINES).format(n=names)})
            notes = [
                self.cc.notification(i, t, c["function"]["arguments"]["description"], r)
                for i, t, c, r in zip(ids, tool_ids, calls, results, strict=True)
            ]
            final.append({"role": "user", "content": self.cc.reminder_sep.join(notes)})
        else:
            final += [
                {
                    "role": "tool",
                    "content": self.cc.handback(r, i, rng.randint(90, 3000), rng.randint(100, 90000)),
                }
                for r, i in zip(results, ids, strict=True)
            ]
        final.append({"role": "assistant", "content": " ".join(results)})
        agent, task = pairs[0]
        own = rng.choice(("You are {a}. {d}", "{d} Keep the reply short.", "Agent {a}: {d}"))
        sub_system = CC_HEAD + own.format(a=agent, d=described[agent]) + self.cc.worker_notes
        sub = [
            {"role": "system", "content": sub_system},
            {"role": "user", "content": task.capitalize() + "."},
            {"role": "system", "content": self.cc.env(folder, None, date)},
            {"role": "assistant", "content": results[0]},
        ]
        offer = offer_of(tools, {"Agent": ("subagent_type", tuple(agents))})
        return AgentCase("claude_code_stock", call, tools, offer, final, tools, mention, extra=((sub, None),))

    # -- Codex

    def codex_env(self) -> StockEnv:
        w, rng = self.w, self.w.rng
        developer = rng.choice(_CODEX_LEADS).format(name=w.made_up())
        override = rng.choice(_CODEX_OVERRIDES).format(name=w.made_up())
        head, tail = self.codex.spawn_parts
        dropped = {n for n in _CODEX_OPTIONAL if rng.random() < 0.7}
        tools = []
        for tool in self.codex.lead_tools:
            name = tool["function"]["name"]
            if name in dropped:
                continue
            if name == "spawn_agent":
                tool = {**tool, "function": {**tool["function"], "description": head + override + tail}}
            tools.append(tool)
        return {"role": "system", "content": developer}, tools

    def _codex_request(self, jobs: list[str], helpers: list[str]) -> str:
        rng = self.w.rng
        if len(jobs) == 1:
            job = jobs[0]
            forms = ["{J}.", "Delegate: {j}", "Please {j}."]
            if helpers:
                forms.append("{J} (the {h} handles this).")
            return rng.choice(forms).format(j=job, J=job.capitalize(), h=helpers[0] if helpers else "")
        if helpers:
            return f"Two parts: {jobs[0]} (the {helpers[0]} knows), and ask the {helpers[-1]} to {jobs[1]}."
        return f"Two jobs: {jobs[0]}, and {jobs[1]}. Report both."

    def codex_stock(self, env: StockEnv | None = None) -> AgentCase:
        w, rng = self.w, self.w.rng
        system, tools = env or self.codex_env()
        jobs = [w.task_text() for _ in range(rng.choice((1, 1, 2)))]
        helpers = w.distinct(lambda: w.agent_name("-"), len(jobs)) if rng.random() < 0.5 else []
        spawns = _calls([_call("spawn_agent", {"message": j.capitalize() + "."}) for j in jobs])
        call = [system, {"role": "user", "content": self._codex_request(jobs, helpers)}, spawns]
        ids = ["-".join(w.hex_id(n) for n in (8, 4, 4, 4, 12)) for _ in jobs]
        results = [w.answer_text() for _ in jobs]
        wait: dict[str, Any] = {"targets": ids}
        if rng.random() < 0.5:
            wait["timeout_ms"] = rng.choice((30000, 60000, 120000))
        status = {i: {"completed": r} for i, r in zip(ids, results, strict=True)}
        notes = "\n".join(
            "<subagent_notification>\n"
            + json.dumps({"agent_path": i, "status": {"completed": r}}, separators=(",", ":"))
            + "\n</subagent_notification>"
            for i, r in zip(ids, results, strict=True)
        )
        final = [
            *call,
            *(
                {
                    "role": "tool",
                    "content": self.codex.spawned.replace("{id}", i).replace(
                        "Euler", w.made_up().capitalize()
                    ),
                }
                for i in ids
            ),
            _calls([_call("wait_agent", wait)]),
            {
                "role": "tool",
                "content": json.dumps({"status": status, "timed_out": False}, separators=(",", ":")),
            },
            {"role": "user", "content": notes},
            {"role": "assistant", "content": " ".join(results)},
        ]
        sub = [
            system,
            {"role": "user", "content": jobs[0].capitalize() + "."},
            {"role": "assistant", "content": results[0]},
        ]
        offered = {t["function"]["name"] for t in tools}
        sub_tools = [t for t in self.codex.sub_tools if t["function"]["name"] in offered]
        offer = offer_of(tools, {})
        # spawn_agent takes `message` or `items`; the drills (and the evaluation) ask for `message`
        offer = Offer({**offer.required, "spawn_agent": ("message",)})
        return AgentCase(
            "codex_stock", call, tools, offer, final, tools, None, extra=((sub, sub_tools or None),)
        )


def _is_claude_code(shape: str) -> bool:
    """Which of the two stock shapes `shape` is; any other shape is refused (env and case alike)."""
    if shape not in STOCK_SHAPES:
        raise ValueError(f"{shape!r} is not a stock shape; the stock shapes are {STOCK_SHAPES}")
    return shape == "claude_code_stock"


def draw_case(writer: AgentDrillWriter, shape: str, stock: StockDrills | None = None) -> AgentCase:
    """A case of any shape, the stock ones included."""
    if shape in STOCK_SHAPES:
        return (stock or StockDrills(writer)).case(shape)
    return writer.case(shape)  # type: ignore[arg-type]
