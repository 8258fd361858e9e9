"""Drills for `smol-agent`: call whatever tools and agent types a request offers, then answer.

A user's own harness offers tools and subagents the policy has never seen: OpenCode's `task` tool with
the user's agents listed in its description, the OpenAI Agents SDK's function tools, handoffs
(`transfer_to_<agent_name>`) and agents used as tools, LangGraph's plain function tools, Claude Code's
`Agent` tool with agent types listed in its description, and Codex's `spawn_agent`. Each shape here is
one such request, written as the harness writes it (the tool JSON of the Agents SDK and of LangChain
is what their own converters emit; tests/models/test_agent_drills.py compares them), and the dialogue
the policy should make of it: hermes tool calls naming an offered tool (and an offered agent type),
with every required argument, then a final answer once the results are back.

Only copying from the request predicts the names: tool names, agent names and parameter names are made
up from `tool_drills`' syllables (millions of words) joined in the ways users name things
(`fact-finder`, `lookup_brastek`, `Glorpin Agent`), and `tool_drills.is_held_out` reserves an eighth of
all made-up words that no drill ever uses; the evaluation (models/agent_eval.py) draws its configurations
from that eighth only.

Which tool a drill calls: the one the user's request names when it names one (as "Ask fact-finder
to ..."), else any offered one (the first for some, drawn for others): what is scored is that a call
parses and names something offered, not which.

Pure functions of a seed; importing this module needs only the standard library.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from models.harness_tools import (
    SDK_HANDOFF_PROMPT,
    agent_as_tool,
    claude_code_env,
    claude_code_tools,
    codex_tools,
    handoff_tool,
    langchain_tool,
    sdk_function_tool,
    tool_name_of,
)
from models.tool_drills import (
    _DAYS,
    _MONTHS,
    _env_template,
    _task_description_head,
    _task_tool,
    draw_word,
    is_held_out,
    made_up_word,
)

Shape = Literal["opencode", "handoff", "sdk_tools", "langgraph", "claude_code", "codex"]
SHAPES: tuple[Shape, ...] = ("opencode", "handoff", "sdk_tools", "langgraph", "claude_code", "codex")


def _split(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_ROLES = _split(
    "finder writer reviewer agent helper planner checker reader scout fixer tester analyst researcher "
    "editor reporter condenser summarizer builder expert worker runner keeper"
)
_VERBS = _split("get find lookup search fetch list check read send make count")
_NOUNS = _split("info data status list report notes records details summary")
_PARAMS = _split("query city name path text topic id key target value date user item word question")
_COMMON = _split("red blue green cat dog sun moon tree fish bird star rain snow milk book door lamp coin")
_TASKS = (
    "find the {a} of {b}",
    "check {a} and {b}",
    "summarise the {a} notes",
    "look into {a}",
    "count the {a} in {b}",
    "read {a} and report",
    "find out about {a} {b}",
    "compare {a} with {b}",
)


# ---- the validity rule the evaluation scores (also what every drill's calls satisfy) -----------------


@dataclass(frozen=True)
class Offer:
    """What a request offers: tool name -> required parameters, and for tools that start an agent, the
    parameter naming the agent type and the types listed."""

    required: dict[str, tuple[str, ...]]
    agent_types: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)

    def check(self, name: str, arguments: Any) -> str | None:
        """None when a call of `name` with `arguments` (a parsed JSON value) is valid, else why not."""
        if name not in self.required:
            return f"{name!r} is not an offered tool"
        if not isinstance(arguments, dict):
            return f"{name!r}: arguments are not a JSON object"
        missing = [p for p in self.required[name] if p not in arguments]
        if missing:
            return f"{name!r}: required arguments {missing} missing"
        if name in self.agent_types:
            param, types = self.agent_types[name]
            if arguments.get(param) not in types:
                return f"{name!r}: {param}={arguments.get(param)!r} is not an offered agent type"
        return None


def offer_of(tools: list[dict[str, Any]], agent_types: dict[str, tuple[str, tuple[str, ...]]]) -> Offer:
    required = {
        t["function"]["name"]: tuple(t["function"].get("parameters", {}).get("required", [])) for t in tools
    }
    return Offer(required, agent_types)


@dataclass(frozen=True)
class AgentCase:
    """One configuration of a shape: the request that should get tool calls (`call`: messages ending with
    the assistant's calls) and the request that should get the final answer (`final`: messages ending
    with it; the same conversation continued, or, after a handoff, the receiving agent's own request)."""

    shape: str  # a Shape, or a stock one (models/stock_drills.py)
    call_messages: list[dict[str, Any]]
    call_tools: list[dict[str, Any]]
    offer: Offer
    final_messages: list[dict[str, Any]]
    final_tools: list[dict[str, Any]]
    target: str | None = None  # the tool or agent type the user's request named, if it named one
    # more chats the case trains (messages, tools), not scored: a subagent's own request and answer
    extra: tuple[tuple[list[dict[str, Any]], list[dict[str, Any]] | None], ...] = ()

    @property
    def continued(self) -> bool:
        """The final request extends the call request (one chat holds both answers)."""
        n = len(self.call_messages)
        return self.final_tools == self.call_tools and self.final_messages[:n] == self.call_messages


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _calls(calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": calls}


# ---- the writer --------------------------------------------------------------------------------------


class AgentDrillWriter:
    """Draws cases from one seeded stream; `held_out`: every made-up word from the held-out eighth."""

    def __init__(self, seed: int, *, held_out: bool = False) -> None:
        self.rng = random.Random(seed)
        self.held_out = held_out
        # compact: the same shapes with the harnesses' fixed text cut to its bones (short descriptions,
        # no environment blocks, no other tools): a cheap way to drill the calls in short windows
        self.compact = False

    # -- pieces

    def made_up(self) -> str:
        while True:
            word = made_up_word(self.rng)
            if is_held_out(word) == self.held_out:
                return word

    def word(self) -> str:
        return draw_word(self.rng, held_out=self.held_out, common_share=0.0 if self.held_out else 0.1)

    def words(self, n: int) -> list[str]:
        out: list[str] = []
        while len(out) < n:
            w = self.word()
            if w not in out:
                out.append(w)
        return out

    def task_text(self) -> str:
        a, b = self.words(2)
        return self.rng.choice(_TASKS).format(a=a, b=b)

    def answer_text(self) -> str:
        return " ".join(self.words(self.rng.randint(1, 3)))

    def hex_id(self, n: int) -> str:
        return "".join(self.rng.choice("0123456789abcdef") for _ in range(n))

    def agent_name(self, sep: str) -> str:
        """A user's agent name: `brastek`, `brastek-finder`, `fact-brastek`, `brastek-glorpin` (sep `-`)."""
        rng, w = self.rng, self.made_up()
        return rng.choice(
            (
                w,
                f"{w}{sep}{rng.choice(_ROLES)}",
                f"{w}{sep}{rng.choice(_ROLES)}",
                f"{rng.choice(_ROLES)}{sep}{w}",
            )
        )

    def distinct(self, draw: Callable[[], str], n: int) -> list[str]:
        out: list[str] = []
        while len(out) < n:
            name = draw()
            if name not in out:
                out.append(name)
        return out

    def tool_name(self) -> str:
        rng, w = self.rng, self.made_up()
        return rng.choice(
            (
                w,
                f"{rng.choice(_VERBS)}_{w}",
                f"{w}_{rng.choice(_NOUNS)}",
                f"{rng.choice(_VERBS)}_{w}_{rng.choice(_NOUNS)}",
            )
        )

    def param_names(self, n: int) -> list[str]:
        return self.distinct(
            lambda: self.rng.choice(_PARAMS) if self.rng.random() < 0.7 else self.made_up(), n
        )

    def ask(self, task: str, target: str | None, kind: str) -> str:
        """The user's request: the task, naming `target` (an agent or tool) when given."""
        if target is None:
            return self.rng.choice(("{t}", "Please {t}.", "{T}.", "Can you {t}?")).format(
                t=task, T=task.capitalize()
            )
        forms = {
            "agent": ("Ask {n} to {t}.", "Use the {n} agent: {t}.", "{T} (give it to {n}).", "Have {n} {t}."),
            "tool": ("Use {n} to {t}.", "{T} with {n}.", "Call {n}: {t}."),
        }[kind]
        return self.rng.choice(forms).format(n=target, t=task, T=task.capitalize())

    def pick(self, names: list[str]) -> tuple[str, str | None]:
        """(the name to call, the name the user's request mentions or None)."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.5:
            name = rng.choice(names)
            return name, name
        return (names[0] if roll < 0.75 else rng.choice(names)), None

    # -- function tools (LangGraph, Agents SDK)

    def function_tool(self, style: Literal["langchain", "sdk"]) -> tuple[dict[str, Any], list[str]]:
        """A made-up function tool as LangChain's `convert_to_openai_tool` or the Agents SDK's converter
        writes it; returns it and the parameters a call must carry."""
        rng = self.rng
        name = self.tool_name()
        required = self.param_names(rng.choice((1, 1, 2)))
        optional = [p for p in self.param_names(rng.choice((0, 0, 1))) if p not in required]
        description = rng.choice(
            ("Look up {a}.", "Find the {a} for a {b}.", "Return {a} data.", "Get {a} by {b}.")
        )
        description = description.format(a=self.made_up(), b=" and ".join(required))
        if style == "sdk":  # strict mode: every parameter is required, defaults or not
            return sdk_function_tool(name, description, required, optional), required + optional
        return langchain_tool(name, description, required, optional), required

    def tool_call_for(self, tool: dict[str, Any], required: list[str], values: list[str]) -> dict[str, Any]:
        return _call(tool["function"]["name"], dict(zip(required, values, strict=True)))

    def tool_ask(self, name: str, required: list[str], values: list[str], named: bool) -> str:
        pairs = ", ".join(f"{p} {v}" for p, v in zip(required, values, strict=True))
        if named:
            return self.rng.choice(("Use {n} with {p}.", "{n}: {p}", "Call {n} for {p}.")).format(
                n=name, p=pairs
            )
        return self.rng.choice(("Look up {p}.", "I need {p}.", "{p}")).format(p=pairs)

    def function_case(
        self, shape: Shape, style: Literal["langchain", "sdk"], system: dict | None
    ) -> AgentCase:
        rng = self.rng
        tools: list[dict[str, Any]] = []
        reqs: list[list[str]] = []
        for _ in range(rng.randint(1, 4)):
            tool, req = self.function_tool(style)
            if tool["function"]["name"] not in {t["function"]["name"] for t in tools}:
                tools.append(tool)
                reqs.append(req)
        i = rng.randrange(len(tools)) if rng.random() < 0.7 else 0
        name = tools[i]["function"]["name"]
        named = rng.random() < 0.5
        values = self.words(len(reqs[i]))
        messages = [system] if system else []
        messages.append({"role": "user", "content": self.tool_ask(name, reqs[i], values, named)})
        call = [*messages, _calls([self.tool_call_for(tools[i], reqs[i], values)])]
        result = self.answer_text()
        final = [
            *call,
            {"role": "tool", "content": rng.choice((result, json.dumps({"result": result})))},
            {
                "role": "assistant",
                "content": rng.choice(("{r}", "{r}", "The result is {r}.")).format(r=result),
            },
        ]
        return AgentCase(shape, call, tools, offer_of(tools, {}), final, tools, name if named else None)

    # -- LangGraph: a tool-calling agent with plain function tools

    def langgraph(self) -> AgentCase:
        system = self.rng.choice(
            (
                None,
                "You are a helpful assistant.",
                "Use the tools to answer.",
                f"You are the {self.made_up()} assistant. Call a tool, then answer.",
            )
        )
        return self.function_case(
            "langgraph", "langchain", {"role": "system", "content": system} if system else None
        )

    # -- Agents SDK

    def sdk_instructions(self, name: str, handoffs: bool) -> str:
        from_sdk = SDK_HANDOFF_PROMPT + "\n\n"
        own = (
            self.rng.choice(
                (
                    f"You are {name}. Route each request to the right agent.",
                    f"You are the {name} agent. Hand the user to the agent that fits.",
                    "Decide which agent should handle the request and transfer to it.",
                )
            )
            if handoffs
            else self.rng.choice((f"You are {name}. Use your tools.", "Answer with the tools you have."))
        )
        return (from_sdk if handoffs and self.rng.random() < 0.5 and not self.compact else "") + own

    def sdk_agent_name(self) -> str:
        w = self.made_up()
        role = self.rng.choice(_ROLES)
        return self.rng.choice(
            (w, f"{w}_{role}", f"{w.capitalize()} {role.capitalize()}", f"{w}_agent", w.capitalize())
        )

    def handoff(self) -> AgentCase:
        """A triage agent with 1-4 handoffs (and maybe function tools) transfers; the receiving agent's own
        request (its instructions, the history with the transfer) gets the final answer."""
        rng = self.rng
        agents = self.distinct(self.sdk_agent_name, rng.randint(1, 4))
        tools = []
        for agent in agents:
            desc = rng.choice(("", f"Handles {self.made_up()} questions.", f"Knows about {self.made_up()}."))
            tools.append(handoff_tool(agent, desc))
        if rng.random() < 0.3:
            tools.insert(rng.randint(0, len(tools)), self.function_tool("sdk")[0])
        agent, mention = self.pick(agents)
        triage = rng.choice(("triage", "Triage Agent", self.sdk_agent_name()))
        user = {"role": "user", "content": self.ask(self.task_text(), mention, "agent")}
        transfer = _calls([_call(tool_name_of(f"transfer_to_{agent}"), {})])
        call = [{"role": "system", "content": self.sdk_instructions(triage, True)}, user, transfer]
        own_tools = [self.function_tool("sdk")[0] for _ in range(rng.choice((0, 0, 1)))]
        final = [
            {"role": "system", "content": self.sdk_instructions(agent, False)},
            user,
            transfer,
            {"role": "tool", "content": json.dumps({"assistant": agent})},
            {"role": "assistant", "content": self.answer_text()},
        ]
        return AgentCase(
            "handoff",
            call,
            tools,
            offer_of(tools, {}),
            final,
            own_tools,
            tool_name_of(f"transfer_to_{mention}") if mention else None,
        )

    def sdk_tools(self) -> AgentCase:
        """Agents SDK function tools, and agents as tools (`Agent.as_tool`: one string `input`)."""
        rng = self.rng
        if rng.random() < 0.5:
            return self.function_case(
                "sdk_tools",
                "sdk",
                {"role": "system", "content": self.sdk_instructions(self.sdk_agent_name(), False)},
            )
        names = self.distinct(self.tool_name, rng.randint(1, 3))
        tools = [
            agent_as_tool(
                n, rng.choice(("", f"Ask the {self.made_up()} agent.", f"Translate to {self.made_up()}."))
            )
            for n in names
        ]
        if rng.random() < 0.3:
            tools.insert(rng.randint(0, len(tools)), self.function_tool("sdk")[0])
        name, mention = self.pick(names)
        task = self.task_text()
        system = {"role": "system", "content": self.sdk_instructions(self.sdk_agent_name(), False)}
        call = [
            system,
            {"role": "user", "content": self.ask(task, mention, "tool")},
            _calls([_call(name, {"input": task})]),
        ]
        result = self.answer_text()
        final = [*call, {"role": "tool", "content": result}, {"role": "assistant", "content": result}]
        return AgentCase("sdk_tools", call, tools, offer_of(tools, {}), final, tools, mention)

    # -- agents named in a tool description (OpenCode, Claude Code)

    def delegations(self, agents: list[str]) -> tuple[str, list[tuple[str, str]], str | None]:
        """The user's request, the (agent, task) pairs it asks for (one or two) and the agent it names."""
        rng = self.rng
        if len(agents) >= 2 and rng.random() < 0.3:
            pair = rng.sample(agents, 2)
            tasks = [self.task_text(), self.task_text()]
            text = f"Ask {pair[0]} to {tasks[0]} and {pair[1]} to {tasks[1]}."
            return text, list(zip(pair, tasks, strict=True)), pair[0]
        agent, mention = self.pick(agents)
        task = self.task_text()
        return self.ask(task, mention, "agent"), [(agent, task)], mention

    def delegation_calls(self, tool: str, pairs: list[tuple[str, str]]) -> dict[str, Any]:
        return _calls(
            [
                _call(
                    tool,
                    {"description": t[:40].capitalize(), "prompt": t.capitalize() + ".", "subagent_type": a},
                )
                for a, t in pairs
            ]
        )

    def opencode(self, env: str | None = None) -> AgentCase:
        """OpenCode's `task` tool (its captured description and schema) listing the user's subagents;
        `env`: the system prompt (drawn when None; cases of one environment share their prefix)."""
        rng = self.rng
        agents = self.distinct(lambda: self.agent_name("-"), rng.randint(1, 4))
        listing = [
            (
                a,
                rng.choice(
                    (
                        f"Handles {self.made_up()} tasks.",
                        f"Finds {self.made_up()} facts.",
                        "Condenses text.",
                        f"Answers questions about {self.made_up()}.",
                    )
                ),
            )
            for a in agents
        ]
        if rng.random() < 0.25:
            listing.insert(
                0,
                (
                    "general",
                    "General-purpose agent for researching complex questions and executing multi-step tasks.",
                ),
            )
        tool = json.loads(json.dumps(_task_tool()))
        head = "Launch a new agent.\n\nAvailable agent types:\n" if self.compact else _task_description_head()
        tool["function"]["description"] = head + "\n".join(f"- {n}: {d}" for n, d in listing)
        if self.compact:
            params = tool["function"]["parameters"]
            params["properties"] = {
                k: params["properties"][k] for k in ("description", "prompt", "subagent_type")
            }
        tools = [tool]
        if env is None:
            env = self.opencode_env().split("\n")[0] if self.compact else self.opencode_env()
        system = {"role": "system", "content": env}
        text, pairs, mention = self.delegations(agents)
        call = [system, {"role": "user", "content": text}, self.delegation_calls("task", pairs)]
        results = [self.answer_text() for _ in pairs]
        final = [
            *call,
            *(
                {
                    "role": "tool",
                    "content": f'<task id="ses_{self.hex_id(26)}" state="completed">\n'
                    f"<task_result>\n{r}\n</task_result>\n</task>",
                }
                for r in results
            ),
            {"role": "assistant", "content": " ".join(results)},
        ]
        types = tuple(n for n, _ in listing)
        offer = offer_of(tools, {"task": ("subagent_type", types)})
        return AgentCase("opencode", call, tools, offer, final, tools, mention)

    def opencode_env(self) -> str:
        rng = self.rng
        prompt = rng.choice(
            (
                "You are the dispatcher. Hand each request to the right subagent with the task tool, "
                "then answer "
                "with what it found.",
                "You delegate. Use the task tool with one of the listed agent types, "
                "then reply with the result.",
                f"You are {self.made_up()}, a lead agent. Give the work to your subagents.",
            )
        )
        folder = "/" + "/".join(self.made_up() for _ in range(rng.randint(1, 3)))
        date = f"{rng.choice(_DAYS)} {rng.choice(_MONTHS)} {rng.randint(1, 28):02d} {rng.randint(2024, 2030)}"
        return prompt + _env_template().format(
            dir=folder, provider="grove", model=rng.choice(("policy", "tiny-agent")), date=date
        )

    def claude_code(self) -> AgentCase:
        """Claude Code's `Agent` tool (agent types listed in its description) beside Bash, Read and Edit;
        the subagent's answer comes back with its `agentId`."""
        rng = self.rng
        agents = self.distinct(lambda: self.agent_name("-"), rng.randint(1, 4))
        listing = [
            (
                a,
                rng.choice(
                    (
                        f"Use for {self.made_up()} work.",
                        f"Researches {self.made_up()}.",
                        "Reviews code changes.",
                        f"Writes {self.made_up()} reports.",
                    )
                ),
                rng.choice(("All tools", "Read, Bash", "Read", "*")),
            )
            for a in agents
        ]
        if rng.random() < 0.25:
            listing.insert(
                rng.randint(0, len(listing)),
                (
                    "general-purpose",
                    "General-purpose agent for researching "
                    "complex questions, searching for code, and executing multi-step tasks.",
                    "*",
                ),
            )
        tools = claude_code_tools(listing, rng, compact=self.compact)
        system = "You are a Claude agent, built on Anthropic's Claude Agent SDK.\n" + rng.choice(
            (
                "You lead a team of subagents. Use the Agent tool to delegate, then report.",
                f"You are the {self.made_up()} lead. Delegate with the Agent tool.",
                "Answer the user. Start subagents with the Agent tool when a listed agent fits.",
            )
        )
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        if rng.random() < 0.5 and not self.compact:
            messages.append(
                {
                    "role": "system",
                    "content": claude_code_env(
                        "/" + "/".join(self.made_up() for _ in range(rng.randint(1, 3))), rng
                    ),
                }
            )
        text, pairs, mention = self.delegations(agents)
        messages.append({"role": "user", "content": text})
        call = [*messages, self.delegation_calls("Agent", pairs)]
        results = [self.answer_text() for _ in pairs]
        final = [
            *call,
            *(
                {
                    "role": "tool",
                    "content": f"{r}\nagentId: {self.hex_id(16)} (use SendMessage with to: "
                    f"'{self.hex_id(16)}' to continue this agent)",
                }
                for r in results
            ),
            {"role": "assistant", "content": " ".join(results)},
        ]
        types = tuple(n for n, _, _ in listing)
        offer = offer_of(tools, {"Agent": ("subagent_type", types)})
        return AgentCase("claude_code", call, tools, offer, final, tools, mention)

    def codex(self) -> AgentCase:
        """Codex's `spawn_agent` (the gateway adds its namespace) beside exec_command and the rest of its
        collaboration tools; the subagent's result comes as a `<subagent_notification>` user turn."""
        rng = self.rng
        tools = codex_tools(rng, compact=self.compact)
        developer = rng.choice(
            (
                "You are Codex, a coding agent. "
                "Spawn subagents with spawn_agent for separate pieces of work.",
                f"You are the {self.made_up()} lead. "
                "Give the work to a subagent with spawn_agent, then report.",
                "Delegate the task to a subagent (spawn_agent), wait for it, then answer.",
            )
        )
        task = self.task_text()
        call = [
            {"role": "system", "content": developer},
            {"role": "user", "content": task.capitalize() + "."},
            _calls([_call("spawn_agent", {"message": task.capitalize() + "."})]),
        ]
        agent_id, nickname = self.hex_id(8) + "-" + self.hex_id(4), self.made_up().capitalize()
        result = self.answer_text()
        note = json.dumps({"agent_path": f"/root/{nickname.lower()}", "status": {"completed": result}})
        final = [
            *call,
            {"role": "tool", "content": json.dumps({"agent_id": agent_id, "nickname": nickname})},
            {"role": "user", "content": f"<subagent_notification>{note}</subagent_notification>"},
            {"role": "assistant", "content": result},
        ]
        # spawn_agent takes `message` or `items`; the drills (and the evaluation) ask for `message`
        offer = offer_of(tools, {})
        offer = Offer({**offer.required, "spawn_agent": ("message",)})
        return AgentCase("codex", call, tools, offer, final, tools, None)

    def case(self, shape: Shape) -> AgentCase:
        return getattr(self, shape)()
