"""Deterministic tool-calling drills for the `tiny-tools` model: OpenCode-shaped dialogues in the exact
chat-template format, with made-up words to copy.

A policy that drives a stock harness must (1) emit well-formed hermes tool calls whose name and JSON
arguments come from the request's tool list, (2) copy the user's words into those arguments, (3) read
tool results and answer, and (4) write and continue from compaction summaries. The drills are rendered
from the real requests of opencode-ai 1.18.33 (models/harness_text/opencode_1_18_33.json, captured from
the binary): its system-prompt environment block, its `task` tool schema and description, its task
result wrapper, its summarization prompt and its post-compaction history. Everything variable is drawn
from one seeded stream: working directory, date, model name, agent names and descriptions, made-up
tools and parameters, and above all the words.

Copying is the hard part (a model memorises a small word list instead of copying it), so the words are
made up from syllables: a pool of millions, each rarely repeated, so only copying from the context
predicts them. `is_held_out` reserves a fixed eighth of all made-up words (by hash) that the drills
never use, neither as words to copy nor as names: evaluation on them measures copying, not memory
(models/tool_eval.py).

Two shapes: `short` dialogues (a compact `task` description, no environment block; ~150-400 tokens)
teach the formats cheaply in short windows, `long` ones (OpenCode's full prompt text) put the same
behaviour at the positions and after the prefix of the real requests.

Pure functions of their arguments; importing this module needs only the standard library (task families
that run in the workflow sandbox draw their words with it).
"""

from __future__ import annotations

import hashlib
import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

HARNESS_TEXT = Path(__file__).parent / "harness_text" / "opencode_1_18_33.json"
Shape = Literal["short", "long"]


def _split(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_ONSETS = _split("b c d f g h j k l m n p r s t v w z") + _split(
    "bl br ch cl cr dr fl fr gl gr kl kr pl pr qu sh sk sl sn sp st sw th tr vr zh"
)
_VOWELS = _split("a e i o u y ai au ea ee ia io oa oo ou")
_CODAS = ("",) * 8 + _split("b d g k l m n p r s t x nd nk rn rt sk st lt")
_COMMON = _split(
    "red blue green cat dog sun moon tree fish bird star rain snow milk book door lamp coin ship road"
)
_HELD_OUT_EIGHTH = 32  # first hash byte below this: held out (1/8 of all words)


@cache
def harness_requests() -> dict[str, dict[str, Any]]:
    """The captured OpenCode request bodies by name (messages, tools)."""
    return json.loads(HARNESS_TEXT.read_text())["requests"]


def harness_texts() -> list[str]:
    """Every fixed text of the captured requests (system prompts, tool schemas as the template renders
    them, user templates): what the tokenizer should learn to compress."""
    from models.corpus import render_chat  # imports the tokenizer library: only where text is rendered

    texts = []
    for body in harness_requests().values():
        texts.append(render_chat(body["messages"], body.get("tools")))
    return texts


def is_held_out(word: str) -> bool:
    """True for the eighth of all made-up words the drills never use (a pure function of the word).
    Evaluation draws only these; the few common words the drills also use are never evaluation words."""
    return hashlib.sha256(word.encode()).digest()[0] < _HELD_OUT_EIGHTH


def made_up_word(rng: random.Random) -> str:
    """A pronounceable made-up word of 2-3 syllables."""
    return "".join(
        rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(rng.randint(2, 3))
    )


def draw_word(rng: random.Random, *, held_out: bool = False, common_share: float = 0.15) -> str:
    """A made-up word (in training, a common one with probability `common_share`) on the requested side
    of the split."""
    if not held_out and rng.random() < common_share:
        return rng.choice(_COMMON)
    while True:
        word = made_up_word(rng)
        if is_held_out(word) == held_out and word not in _COMMON:
            return word


def draw_words(
    rng: random.Random, n: int, *, held_out: bool = False, common_share: float = 0.15
) -> list[str]:
    """`n` distinct words (see `draw_word`)."""
    words: list[str] = []
    while len(words) < n:
        w = draw_word(rng, held_out=held_out, common_share=common_share)
        if w not in words:
            words.append(w)
    return words


# ---- OpenCode's fixed text, split into template parts ---------------------------------------------

# The lead's prompt in the captured config (the environment block is found after it).
LEAD_PROMPT = (
    "You are the lead. Give each word the user lists to its own worker with the task tool (subagent_type "
    "worker, the word as the prompt), all at once. When the workers answer, reply with their words."
)
WORKER_PROMPT = "You are a worker. Reply with the word you are given."
LEAD_PROMPTS = (
    LEAD_PROMPT,
    "You are the lead. Hand each word to a worker with the task tool, then answer with the words.",
    "You delegate. Call the task tool once per word, all at once, then reply with what the workers said.",
)
WORKER_PROMPTS = (
    WORKER_PROMPT,
    "You are a worker. Answer with the word you are given.",
    "Repeat the word you are given, nothing else.",
)


@cache
def _env_template() -> str:
    """The lead's captured system prompt after its own prompt: the environment block, with slots."""
    system = harness_requests()["lead_first"]["messages"][0]["content"]
    rest = system[len(LEAD_PROMPT) :]
    for old, new in (
        ("/tmp/tm-oc/proj1", "{dir}"),
        ("grove/policy", "{provider}/{model}"),
        ("named policy", "named {model}"),
        ("Tue Dec 01 2026", "{date}"),
    ):
        if old not in rest:
            raise ValueError(f"{HARNESS_TEXT}: the lead's system prompt no longer contains {old!r}")
        rest = rest.replace(old, new)
    return rest


@cache
def _task_tool() -> dict[str, Any]:
    return harness_requests()["lead_first"]["tools"][0]


@cache
def _task_description_head() -> str:
    description = _task_tool()["function"]["description"]
    return description[: description.index("- worker: ")]


def task_tool(agents: list[tuple[str, str]], shape: Shape) -> dict[str, Any]:
    """OpenCode's `task` tool listing `agents` (name, description); `short` keeps only the agent list."""
    tool = json.loads(json.dumps(_task_tool()))
    listing = "\n".join(f"- {name}: {desc}" for name, desc in agents)
    if shape == "long":
        tool["function"]["description"] = _task_description_head() + listing
    else:
        tool["function"]["description"] = "Launch a new agent.\n\nAvailable agent types:\n" + listing
        params = tool["function"]["parameters"]
        params["properties"] = {
            k: params["properties"][k] for k in ("description", "prompt", "subagent_type")
        }
    return tool


@cache
def opencode_default_tools() -> list[dict[str, Any]]:
    """OpenCode's default agent's tools other than `task` (bash, read, ...), as captured."""
    tools = harness_requests()["default_first"]["tools"]
    return [t for t in tools if t["function"]["name"] != "task"]


@cache
def _summary_texts() -> tuple[str, str, str]:
    """(system prompt, user text before the conversation, user text after it) of OpenCode's
    compaction call."""
    messages = harness_requests()["summary"]["messages"]
    user = messages[1]["content"]
    start, end = user.index("<conversation>\n") + len("<conversation>\n"), user.index("</conversation>")
    return messages[0]["content"], user[:start], user[end:]


@cache
def _compaction_turns() -> tuple[str, str]:
    messages = harness_requests()["after_compaction"]["messages"]
    return messages[1]["content"], messages[3]["content"]


# ---- the drill writer ------------------------------------------------------------------------------

_DAYS = _split("Mon Tue Wed Thu Fri Sat Sun")
_MONTHS = _split("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec")
_LEAD_ASKS = (
    '"Words: {ws}"',
    '"Words: {ws}"',
    "Words: {ws}",
    "Words:\n{lines}",
    '"Give {and} to the workers."',
    "Ask the workers about {and}.",
)
_DESCRIPTIONS = ("Answer {w}", "Answer {w}", "Word {w}", "Repeat {w}", "Reply {w}")
_TASK_PROMPTS = (
    "Reply with the word {w}.",
    "Reply with the word {w}.",
    "Reply with the word {w}.",
    "Repeat the word {w}.",
    "Word: {w}",
)
_FINALS = ("{ws}", "{ws}", "{ws}", "{lines}", "The workers said {and}.")
_WORKER_ANSWERS = ("{w}", "{w}", "{w}", "{w}", "{w}.", "The word is {w}.")
_PARAM_NAMES = ("query", "name", "path", "city", "text", "word", "key", "target", "value", "topic")
_TOOL_ASKS = (
    "Use {tool} with {pairs}.",
    "{tool}: {pairs}",
    "Call {tool} for {values}.",
    "Please look up {values}.",
)
_TOOL_FINALS = ("{result}", "{result}", "The result is {result}.")


def _string_required(tool: dict[str, Any]) -> list[str]:
    """The required string parameters of a tool (the ones a drill fills with words)."""
    params = tool["function"].get("parameters", {})
    props = params.get("properties", {})
    return [p for p in params.get("required", []) if props.get(p, {}).get("type") == "string"]


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _fill(words: list[str]) -> dict[str, str]:
    return {"ws": " ".join(words), "lines": "\n".join(words), "and": _and(words)}


@dataclass(frozen=True)
class Dialogue:
    """One drill: OpenAI-style messages and the request's tools (None: a call without tools)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None

    def render(self) -> str:
        """The text the tiny model's chat template makes of it (what the gateway would render)."""
        from models.corpus import render_chat  # imports the tokenizer library: only where text is rendered

        return render_chat(self.messages, self.tools)


class ToolDrillWriter:
    """Draws drill dialogues from one seeded stream; every choice goes through `self.rng`."""

    def __init__(self, seed: int, *, held_out: bool = False) -> None:
        self.rng = random.Random(seed)
        self.held_out = held_out

    # -- pieces

    def words(self, n: int) -> list[str]:
        return draw_words(self.rng, n, held_out=self.held_out)

    def name(self) -> str:
        """A made-up name (directory, tool, agent): never a held-out word, so none is ever trained on."""
        while True:
            word = made_up_word(self.rng)
            if not is_held_out(word):
                return word

    def session_id(self) -> str:
        hexpart = "".join(self.rng.choice("0123456789abcdef") for _ in range(12))
        return (
            "ses_"
            + hexpart
            + "".join(self.rng.choice(string.ascii_letters + string.digits) for _ in range(14))
        )

    def env(self) -> str:
        rng = self.rng
        folder = "/" + "/".join(self.name() for _ in range(rng.randint(1, 3)))
        date = f"{rng.choice(_DAYS)} {rng.choice(_MONTHS)} {rng.randint(1, 28):02d} {rng.randint(2024, 2030)}"
        model = rng.choice(("policy", "tiny", self.name()))
        provider = rng.choice(("grove", "local", self.name()))
        return _env_template().format(dir=folder, provider=provider, model=model, date=date)

    def system(self, prompts: tuple[str, ...], shape: Shape) -> dict[str, str]:
        prompt = self.rng.choice(prompts)
        return {"role": "system", "content": prompt + (self.env() if shape == "long" else "")}

    def agents(self) -> list[tuple[str, str]]:
        """The subagents the `task` tool lists: mostly `worker`, sometimes made-up ones too."""
        rng = self.rng
        agents = [("worker", rng.choice(("Repeats the word it is given.", "Answers with one word.")))]
        for _ in range(rng.choice((0, 0, 1, 2))):
            agents.append((self.name(), f"Handles {self.name()} tasks."))
        rng.shuffle(agents)
        return agents

    def made_up_tool(self) -> dict[str, Any]:
        rng = self.rng
        name = rng.choice(("{a}", "get_{a}", "{a}_{b}", "find_{a}"))
        name = name.format(a=self.name(), b=rng.choice(("lookup", "search", "list", self.name())))
        params = rng.sample(_PARAM_NAMES, rng.randint(1, 2))
        properties = {p: {"type": "string", "description": f"The {p}."} for p in params}
        return {
            "type": "function",
            "function": {
                "name": name,
                "description": f"Look up a {self.name()} by {' and '.join(params)}.",
                "parameters": {"type": "object", "properties": properties, "required": params},
            },
        }

    def task_result(self, answer: str) -> dict[str, str]:
        # OpenCode's wrapper of a subagent's answer, id = the child session's id
        text = f'<task id="{self.session_id()}" state="completed">\n<task_result>\n{answer}\n'
        text += "</task_result>\n</task>"
        return {"role": "tool", "content": text}

    # -- dialogues

    def lead(self, shape: Shape) -> Dialogue:
        """The delegation shape: words in, one `task` call per word, results back, words out."""
        rng = self.rng
        agents = self.agents()
        tools = [task_tool(agents, shape)]
        if rng.random() < 0.2:
            tools.insert(rng.randint(0, 1), self.made_up_tool())
        words = self.words(rng.choice((1, 2, 2, 2, 3)))
        fill = _fill(words)
        target = "worker" if rng.random() < 0.8 else rng.choice(agents)[0]
        calls = []
        for w in words:
            arguments = {
                "description": rng.choice(_DESCRIPTIONS).format(w=w),
                "prompt": rng.choice(_TASK_PROMPTS).format(w=w),
                "subagent_type": target,
            }
            calls.append({"type": "function", "function": {"name": "task", "arguments": arguments}})
        messages: list[dict[str, Any]] = [
            self.system(LEAD_PROMPTS, shape),
            {"role": "user", "content": rng.choice(_LEAD_ASKS).format(**fill)},
            {"role": "assistant", "content": "", "tool_calls": calls},
        ]
        for w in words:
            messages.append(self.task_result(rng.choice(_WORKER_ANSWERS).format(w=w)))
        messages.append({"role": "assistant", "content": rng.choice(_FINALS).format(**fill)})
        return Dialogue(messages, tools)

    def worker(self, shape: Shape) -> Dialogue:
        w = self.words(1)[0]
        messages: list[dict[str, Any]] = [
            self.system(WORKER_PROMPTS, shape),
            {"role": "user", "content": self.rng.choice(_TASK_PROMPTS).format(w=w)},
            {"role": "assistant", "content": w},
        ]
        return Dialogue(messages)

    def tool_use(self, shape: Shape) -> Dialogue:
        """A made-up tool (among others, OpenCode's own in the long shape) called with the user's values."""
        rng = self.rng
        tools = [self.made_up_tool() for _ in range(rng.randint(1, 3))]
        if shape == "long":
            tools += rng.sample(opencode_default_tools(), rng.randint(0, 2))
            rng.shuffle(tools)
        usable = [(t, _string_required(t)) for t in tools]
        fn, required = rng.choice([(t["function"], req) for t, req in usable if req])
        values = self.words(len(required))
        arguments = dict(zip(required, values, strict=True))
        ask = rng.choice(_TOOL_ASKS).format(
            tool=fn["name"],
            pairs=", ".join(f"{p} {v}" for p, v in arguments.items()),
            values=_and(values),
        )
        result = self.words(1)[0]
        call = {"type": "function", "function": {"name": fn["name"], "arguments": arguments}}
        messages: list[dict[str, Any]] = [
            self.system(("You are a helpful assistant.", "Use the tools."), shape),
            {"role": "user", "content": ask},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": rng.choice((result, json.dumps({"result": result})))},
            {"role": "assistant", "content": rng.choice(_TOOL_FINALS).format(result=result)},
        ]
        return Dialogue(messages, tools)

    def summary_text(self, ask: str, word: str) -> str:
        return (
            f"## Objective\n- {ask}\n\n## Important Details\n- The word is {word}.\n\n## Work State\n"
            f"### Completed\n- Replied {word}.\n\n### Active\n- (none)\n\n### Blocked\n- (none)\n\n"
            "## Next Move\n1. (none)\n2. (none)\n\n## Relevant Files\n- (none)"
        )

    def summary(self, shape: Shape) -> Dialogue:
        """OpenCode's compaction call: the flattened conversation in, the template filled out."""
        w = self.words(1)[0]
        ask = self.rng.choice(_TASK_PROMPTS).format(w=w)
        system, before, after = _summary_texts()
        conversation = f"[User]: {ask}\n\n[Assistant]: {w}\n"
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": before + conversation + after},
            {"role": "assistant", "content": self.summary_text(ask, w)},
        ]
        return Dialogue(messages)

    def after_compaction(self, shape: Shape) -> Dialogue:
        """A session rewritten after compaction: the summary, then "Continue..." -> the word again."""
        w = self.words(1)[0]
        ask = self.rng.choice(_TASK_PROMPTS).format(w=w)
        question, cont = _compaction_turns()
        messages: list[dict[str, Any]] = [
            self.system(WORKER_PROMPTS, shape),
            {"role": "user", "content": question},
            {"role": "assistant", "content": self.summary_text(ask, w)},
            {"role": "user", "content": cont},
            {"role": "assistant", "content": w},
        ]
        return Dialogue(messages)

    def dialogue(self, shape: Shape) -> Dialogue:
        return self.rng.choice(_MIX)(self, shape)

    def document(self, shape: Shape) -> str:
        return self.dialogue(shape).render()


_MIX: tuple[Callable[[ToolDrillWriter, Shape], Dialogue], ...] = (
    *(ToolDrillWriter.lead,) * 4,
    *(ToolDrillWriter.worker,) * 2,
    *(ToolDrillWriter.tool_use,) * 2,
    ToolDrillWriter.summary,
    ToolDrillWriter.after_compaction,
)


def generate_tool_drills(seed: int, *, n_documents: int, shape: Shape) -> list[str]:
    """`n_documents` drill dialogues of `shape`; a pure function of its arguments (no held-out word)."""
    writer = ToolDrillWriter(seed)
    return [writer.document(shape) for _ in range(n_documents)]
