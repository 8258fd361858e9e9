"""Deterministic synthetic text for training the tiny model's tokenizer and its short pretraining.

The corpus is a pure function of the seed: plain sentences, arithmetic questions with correct
answers, short code snippets, and chat dialogues rendered with the tiny model's own chat template
(system/user/assistant turns, hermes tool calls and tool results). The chat part teaches the model
the turn structure, so that even a briefly trained model ends turns with `<|im_end|>` and can emit
well-formed `<tool_call>` blocks.

A quarter of the documents are generic instruction-following drills: *echo* (the user gives a word,
the assistant repeats it) and *report* (the assistant hands items to helpers, their answers come back
as tool results, the assistant lists them). Their answers come in several styles (the bare word, a
sentence around it, ...), so a pretrained tiny model sometimes, not always, answers with just the
word: RL on tasks such as `delegation` has a behaviour to sharpen rather than one to invent.

`generate_copy_drills` makes the plainest echo dialogues for the builder's short copy warm-up
(models/tiny.py): a model this small does not discover attention-based copying from the mixed corpus
within its step budget, and without copying no word task is learnable.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

from models.tokenizer import CHAT_TEMPLATE


def _words(text: str, sep: str | None = None) -> tuple[str, ...]:
    return tuple(text.split(sep))


_NOUNS = _words(
    "cat dog river city tree bird garden window teacher engineer robot planet ocean mountain book "
    "train market farmer child lamp bridge forest village doctor student computer kitchen boat cloud"
)
_VERBS = _words("sees finds builds paints likes moves opens follows reads carries watches visits helps")
_ADJECTIVES = _words("small quiet bright old green fast happy tall cold warm red blue calm busy")
_PLACES = _words(
    "near the station|in the park|by the sea|under the bridge|at home|in the morning|after lunch", sep="|"
)
_CITIES = _words("Oslo Paris Lima Cairo Tokyo Quito Rome Berlin Madrid Nairobi Dublin Seoul")
_WEATHER = _words("sunny|rainy|cloudy|windy|snowing|foggy", sep="|")
_SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a concise assistant. Answer briefly.",
    "You solve arithmetic problems.",
)
_OPS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
}

TOOLS: list[dict] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
]


_ONSETS = _words("b c d f g h k l m n p r s t v w z br ch dr gl kr pl sh st th tr")
_VOWELS = _words("a e i o u ai ea io ou")
_CODAS = ("",) * 6 + _words("n r s l m nd st rk")
_CHAT_SHARE = 0.55  # the rest: paragraphs, arithmetic drills, code
_DRILL_SHARE = 0.25  # of all documents: echo and report drills (taken out of the chat share)
_ECHO_TURNS = 2  # at most, per echo dialogue
_ECHO_NAME_SHARE = 0.3  # echo words that are lexicon names rather than common words

# Short common words for the drills (a generic list; any word task draws on words like these).
_COMMON_WORDS = _words(
    "red blue green black white gold cat dog fish bird cow horse sun moon star rain snow wind fire ice "
    "tree leaf rose milk tea bread egg salt book door key box cup hat pen map bed car bus ship road hill "
    "lake sea sand rock ring bell coin drum"
)
# A word on a line of its own is tokenized as it is at the start of an answer (no leading space).
_ECHO_ASKS = (
    "Word:\n{w}",
    "Word:\n{w}",
    "Repeat:\n{w}",
    "{w}",
    "Word: {w}",
    "Say {w}.",
    "Repeat the word {w}.",
)
_ECHO_ANSWERS = ("{w}", "{w}", "{w}.", "{W}.", "The word is {w}.", "You said {w}.", "{w} {w}", "Sure: {w}")
_ECHO_SYSTEMS = (
    "You are a helpful assistant.",
    "You repeat what you are given.",
    "Answer with one word.",
    "You are a helper. Repeat the word.",
)
_REPORT_ASKS = ("Words:\n{lines}", "Items:\n{lines}", "Words: {ws}", "Ask about {and}.")
_REPORT_HANDOFFS = ("I will ask the helpers.", "Asking.", "Let me check {and}.", "{ws}", "OK.")
_REPORT_FINALS = ("{lines}", "{ws}", "{and}.", "The words are {and}.", "I got {ws}.", "{first}.")
_REPORT_SYSTEMS = (
    "You are the lead. Ask helpers, then report their answers.",
    "You are a helpful assistant.",
    "Hand out the items, then list the answers.",
)


def _lexicon(rng: random.Random, size: int) -> list[str]:
    """Pseudo-words (place and person names): a few thousand distinct, often repeated strings give BPE
    enough merges for a ~2k vocabulary, which the small fixed word lists alone cannot."""
    words: set[str] = set()
    while len(words) < size:
        n = rng.randint(2, 4)
        words.add("".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(n)))
    return sorted(words)


def render_chat(messages: list[dict], tools: list[dict] | None = None) -> str:
    """Render a conversation with the tiny model's template, exactly as `apply_chat_template` would."""
    from transformers.utils.chat_template_utils import render_jinja_template  # heavy import

    offered: list[dict | Callable] | None = list(tools) if tools is not None else None
    # transformers annotates the return as str; it is (rendered conversations, generation indices)
    rendered, _ = render_jinja_template(  # type: ignore[str-unpack]
        [messages], tools=offered, chat_template=CHAT_TEMPLATE
    )
    return rendered[0]


class _Writer:
    """Draws documents from one seeded random stream; every choice goes through `self.rng`."""

    def __init__(self, seed: int, lexicon_size: int) -> None:
        self.rng = random.Random(seed)
        self.lexicon = _lexicon(self.rng, lexicon_size)

    def name(self) -> str:
        # Squaring a uniform draw skews towards the first words: a Zipf-like frequency profile.
        return self.lexicon[int(len(self.lexicon) * self.rng.random() ** 2)].capitalize()

    def sentence(self) -> str:
        rng = self.rng
        subject = self.name() if rng.random() < 0.4 else f"The {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
        obj = f"a {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
        place = rng.choice(_PLACES) if rng.random() < 0.6 else f"in {self.name()}"
        return f"{subject} {rng.choice(_VERBS)} {obj} {place}."

    def paragraph(self) -> str:
        return " ".join(self.sentence() for _ in range(self.rng.randint(2, 6)))

    def problem(self) -> tuple[str, int]:
        op = self.rng.choice(tuple(_OPS))
        a, b = self.rng.randint(0, 99), self.rng.randint(0, 99 if op != "*" else 12)
        return f"{a} {op} {b}", _OPS[op](a, b)

    def arithmetic(self) -> str:
        lines = []
        for _ in range(self.rng.randint(1, 4)):
            expr, value = self.problem()
            lines.append(f"Q: What is {expr}?\nA: {value}")
        return "\n".join(lines)

    def code(self) -> str:
        rng = self.rng
        name, k, op = rng.choice(_NOUNS), rng.randint(1, 9), rng.choice(tuple(_OPS))
        snippets = (
            f"def {name}_{k}(x):\n    return x {op} {k}\n",
            f"for i in range({k}):\n    print(i {op} {rng.randint(1, 9)})\n",
            f"{name} = [{', '.join(str(rng.randint(0, 99)) for _ in range(k))}]\n",
            f"if {name} > {k}:\n    {name} = {name} {op} 1\nelse:\n    {name} = 0\n",
        )
        return rng.choice(snippets)

    def system(self) -> list[dict]:
        if self.rng.random() < 0.5:
            return [{"role": "system", "content": self.rng.choice(_SYSTEM_PROMPTS)}]
        return []

    def arithmetic_chat(self) -> str:
        messages = self.system()
        for _ in range(self.rng.randint(1, 2)):
            expr, value = self.problem()
            messages.append({"role": "user", "content": f"What is {expr}?"})
            messages.append({"role": "assistant", "content": f"{expr} = {value}"})
        return render_chat(messages)

    def weather_chat(self) -> str:
        city = self.rng.choice(_CITIES) if self.rng.random() < 0.5 else self.name()
        weather = self.rng.choice(_WEATHER)
        call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
        messages = self.system() + [
            {"role": "user", "content": f"What is the weather in {city}?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": json.dumps({"city": city, "weather": weather})},
            {"role": "assistant", "content": f"It is {weather} in {city}."},
        ]
        return render_chat(messages, TOOLS)

    def calculator_chat(self) -> str:
        expr, value = self.problem()
        call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expr}}}
        messages = self.system() + [
            {"role": "user", "content": f"Use the calculator: {expr}"},
            {"role": "assistant", "content": "Let me compute that.", "tool_calls": [call]},
            {"role": "tool", "content": str(value)},
            {"role": "assistant", "content": f"The answer is {value}."},
        ]
        return render_chat(messages, TOOLS)

    def small_talk_chat(self) -> str:
        messages = self.system()
        for _ in range(self.rng.randint(1, 3)):
            topic = self.name() if self.rng.random() < 0.5 else f"the {self.rng.choice(_NOUNS)}"
            messages.append({"role": "user", "content": f"Tell me about {topic}."})
            messages.append({"role": "assistant", "content": self.paragraph()})
        return render_chat(messages)

    def echo_word(self) -> str:
        # Mostly common words, some rare names: rare words make copying from the context pay off more
        # than guessing a frequent word does.
        if self.rng.random() < _ECHO_NAME_SHARE:
            return self.name().lower()
        return self.rng.choice(_COMMON_WORDS)

    def echo_chat(self) -> str:
        """The user gives words, one per turn; the assistant repeats each, in one of several styles."""
        rng = self.rng
        messages = [{"role": "system", "content": rng.choice(_ECHO_SYSTEMS)}] if rng.random() < 0.7 else []
        for _ in range(rng.randint(1, _ECHO_TURNS)):
            word = self.echo_word()
            messages.append({"role": "user", "content": rng.choice(_ECHO_ASKS).format(w=word)})
            answer = rng.choice(_ECHO_ANSWERS).format(w=word, W=word.capitalize())
            messages.append({"role": "assistant", "content": answer})
        return render_chat(messages)

    def copy_drill(self) -> str:
        """The plainest echo: one word on its own line, repeated bare (the builder's copy warm-up)."""
        messages = (
            [{"role": "system", "content": self.rng.choice(_ECHO_SYSTEMS)}] if self.rng.random() < 0.7 else []
        )
        word = self.echo_word()
        messages.append({"role": "user", "content": f"Word:\n{word}"})
        messages.append({"role": "assistant", "content": word})
        return render_chat(messages)

    def report_chat(self) -> str:
        """Items go out to helpers, their answers come back as tool results, the assistant lists them."""
        rng = self.rng
        items = rng.sample(_COMMON_WORDS, rng.randint(1, 3))
        fill = {
            "ws": " ".join(items),
            "lines": "\n".join(items),
            "and": " and ".join(items),
            "first": items[0],
        }
        messages = [{"role": "system", "content": rng.choice(_REPORT_SYSTEMS)}] if rng.random() < 0.7 else []
        messages.append({"role": "user", "content": rng.choice(_REPORT_ASKS).format(**fill)})
        messages.append({"role": "assistant", "content": rng.choice(_REPORT_HANDOFFS).format(**fill)})
        for item in items:
            answer = (
                item if rng.random() < 0.6 else rng.choice(_ECHO_ANSWERS).format(w=item, W=item.capitalize())
            )
            messages.append({"role": "tool", "content": answer})
        messages.append({"role": "assistant", "content": rng.choice(_REPORT_FINALS).format(**fill)})
        return render_chat(messages)

    def document(self) -> str:
        draw = self.rng.random()
        if draw < _DRILL_SHARE:
            return self.rng.choice(_DRILLS)(self)
        if draw < _CHAT_SHARE:
            chats = (self.arithmetic_chat, self.weather_chat, self.calculator_chat, self.small_talk_chat)
            return self.rng.choice(chats)()
        return self.rng.choice((self.paragraph, self.arithmetic, self.code))()


# Echo twice as often as report.
_DRILLS = (_Writer.echo_chat, _Writer.echo_chat, _Writer.report_chat)


def generate_corpus(seed: int, *, n_documents: int, lexicon_size: int = 3000) -> list[str]:
    """`n_documents` synthetic documents; a pure function of its arguments."""
    writer = _Writer(seed, lexicon_size)
    return [writer.document() for _ in range(n_documents)]


def generate_copy_drills(seed: int, *, n_documents: int, lexicon_size: int = 3000) -> list[str]:
    """`n_documents` plain echo dialogues (`copy_drill`); a pure function of its arguments."""
    writer = _Writer(seed, lexicon_size)
    return [writer.copy_drill() for _ in range(n_documents)]
