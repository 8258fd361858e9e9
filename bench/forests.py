"""Synthetic episodes as *calls*, and the rows built from them: the learner benchmark's workload,
and the learner tests' (tests import them from here; this module imports only the product).

`random_episode` grows a multi-agent episode the way a harness would: a parent context whose calls
continue each other (prompt = previous prompt + completion + new observation), worker contexts
spawned by parent calls whose answers come back into the parent as observations, compaction (a
rewrite: a new root whose prompt is a summary), kept forks (two selected calls extending one
ancestor), discarded retries and auxiliary calls.

`rows_from_calls` turns the calls into receipts and staged tokens and runs the real reconstruction
(trainer/forest.py `reconstruct`). The per-call reference in tests/learner/test_reference.py never
uses rows: it reads the calls.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from grove.receipts import CallKind, CallReceipt, CallState
from grove.sampling import SamplingProcessing
from grove.staging_format import CallTokens
from trainer.forest import EpisodeRef, ReconstructionOptions, reconstruct
from trainer.rows import Row, Span


@dataclass(frozen=True)
class Call:
    call_id: str  # canonical order = sorted call ids (agent, context, index, zero-padded)
    agent: str
    context_id: str
    parent_call_id: str | None
    prompt: np.ndarray  # int32 [P]
    completion: np.ndarray  # int32 [C]
    logprobs: np.ndarray  # float32 [C], behaviour logprobs
    selected: bool = True
    kind: str = "action"  # or "auxiliary"
    temperature: float = 1.0  # the sampling processing the call was "generated" with
    top_p: float = 1.0

    @property
    def eligible(self) -> bool:
        return self.selected and self.kind == "action"


@dataclass
class Episode:
    episode_id: str
    group_id: str
    reward: float
    calls: list[Call] = field(default_factory=list)
    valid: bool = True


class _Builder:
    def __init__(self, rng: np.random.Generator, vocab: int, episode_id: str, scale: int) -> None:
        self.rng, self.vocab, self.episode_id, self.scale = rng, vocab, episode_id, scale
        self.calls: list[Call] = []
        self.counters: dict[str, int] = {}

    def tokens(self, lo: int, hi: int) -> np.ndarray:
        n = int(self.rng.integers(lo * self.scale, hi * self.scale + 1))
        return self.rng.integers(3, self.vocab, size=n).astype(np.int32)

    def call(
        self, agent: str, context: str, parent: Call | None, prompt: np.ndarray, completion=None, **kw
    ) -> Call:
        n = self.counters.get(context, 0)
        self.counters[context] = n + 1
        completion = self.tokens(2, 8) if completion is None else completion
        logprobs = -self.rng.uniform(0.05, 4.0, size=completion.size).astype(np.float32)
        c = Call(
            call_id=f"{context}/{n:03d}",
            agent=agent,
            context_id=context,
            parent_call_id=parent.call_id if parent else None,
            prompt=prompt.astype(np.int32),
            completion=completion,
            logprobs=logprobs,
            **kw,
        )
        self.calls.append(c)
        return c

    def extend(self, head: Call, observation: np.ndarray, **kw) -> Call:
        prompt = np.concatenate([head.prompt, head.completion, observation])
        return self.call(head.agent, head.context_id, head, prompt, **kw)


def random_episode(
    rng: np.random.Generator,
    episode_id: str,
    group_id: str,
    reward: float,
    *,
    vocab: int,
    size: int = 3,
    scale: int = 1,
) -> Episode:
    """A random multi-agent episode with about `size` parent turns (see the module docstring).

    Token counts are small (completions of 2-8 tokens) times `scale`.
    """
    b = _Builder(rng, vocab, episode_id, scale)
    ctx = 0
    head = b.call("parent", f"parent/c{ctx}", None, b.tokens(4, 12))
    for _ in range(size):
        kind = rng.choice(["continue", "worker", "compact", "fork", "retry", "aux"])
        if kind == "worker":
            w = f"worker-{len(b.counters)}"
            wh = b.call(w, f"{w}/c0", None, b.tokens(3, 8))
            for _ in range(int(rng.integers(0, 3))):
                wh = b.extend(wh, b.tokens(1, 4))
            # The worker's answer comes back to the parent as an observation (no loss there).
            head = b.extend(head, np.concatenate([b.tokens(1, 2), wh.completion]))
        elif kind == "compact":
            ctx += 1
            summary = np.concatenate([b.tokens(2, 4), head.completion[:3]])
            head = b.call("parent", f"parent/c{ctx}", None, summary)
        elif kind == "fork":
            # Two selected calls extend the same head: two endpoints share the prefix.
            b.extend(head, b.tokens(1, 3))
            head = b.extend(head, b.tokens(1, 3))
        elif kind == "retry":
            b.extend(head, b.tokens(1, 3), selected=False)  # discarded: recorded, never trained
            head = b.extend(head, b.tokens(1, 3))
        elif kind == "aux":
            b.call("parent", f"aux/c{len(b.counters)}", None, b.tokens(2, 5), kind="auxiliary")
            head = b.extend(head, b.tokens(1, 3))
        else:
            head = b.extend(head, b.tokens(1, 5))
    return Episode(episode_id, group_id, reward, b.calls)


def _receipt(c: Call, tokens: CallTokens) -> CallReceipt:
    if c.kind == "auxiliary":
        kind, state = CallKind.AUXILIARY, CallState.AUXILIARY
    else:
        kind, state = CallKind.ACTION, CallState.SELECTED if c.selected else CallState.DISCARDED
    return CallReceipt(
        call_id=c.call_id,
        context_id=c.context_id,
        agent=c.agent,
        kind=kind,
        parent_call_id=c.parent_call_id,
        state=state,
        digests=tokens.digests(),
        policy_version=0,
        sampling=SamplingProcessing(temperature=c.temperature, top_p=c.top_p),
    )


def rows_from_calls(ep: Episode, *, parent_only: bool = False) -> list[Row]:
    """The episode's rows from trainer/forest.py `reconstruct` (links verified on tokens).

    `parent_only`: the run's agent filter trains only the parent's calls (workers' calls remain
    conditioning). An invalid episode's rows are marked valid=False (a failed episode's placeholders).
    """
    tokens = {c.call_id: CallTokens.of(c.prompt, c.completion, c.logprobs) for c in ep.calls}
    receipts = [_receipt(c, tokens[c.call_id]) for c in ep.calls]
    members = {r.call_id for r in receipts if r.state in (CallState.SELECTED, CallState.AUXILIARY)}
    options = ReconstructionOptions(train_agents="parent_only" if parent_only else "all")
    rows = reconstruct(
        EpisodeRef(episode_id=ep.episode_id, group_id=ep.group_id),
        receipts,
        {k: v for k, v in tokens.items() if k in members},
        options,
        reward=ep.reward,
    ).rows
    return rows if ep.valid else [dataclasses.replace(r, valid=False) for r in rows]


def per_call_rows(episodes: list[Episode]) -> list[Row]:
    """Each eligible call alone: its prompt + completion, loss on its completion."""
    rows = []
    for ep in episodes:
        for c in ep.calls:
            if not c.eligible:
                continue
            ids = np.concatenate([c.prompt, c.completion]).astype(np.int32)
            p, n = c.prompt.size, c.completion.size
            mask = np.zeros(ids.size, bool)
            mask[p:] = True
            blp = np.zeros(ids.size, np.float32)
            blp[p:] = c.logprobs
            span = Span(c.call_id, c.agent, p, p + n, True, True, 0, c.temperature, c.top_p)
            rows.append(Row(f"{ep.episode_id}#{c.call_id}", ep.episode_id, ep.group_id, ids, mask, blp,
                            (span,), ep.reward))  # fmt: skip
    return rows


def with_mixed_sampling(
    episodes: list[Episode], settings: list[tuple[float, float]], seed: int
) -> list[Episode]:
    """The same episodes, each call given a (temperature, top_p) drawn from `settings` (own rng)."""
    rng = np.random.default_rng(seed)
    out = []
    for ep in episodes:
        calls = []
        for c in ep.calls:
            t, p = settings[int(rng.integers(len(settings)))]
            calls.append(dataclasses.replace(c, temperature=t, top_p=p))
        out.append(dataclasses.replace(ep, calls=calls))
    return out


def random_batch(
    seed: int, *, vocab: int, groups: int = 2, group_size: int = 3, size: int = 3
) -> list[Episode]:
    """`groups` x `group_size` random episodes with random rewards."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        for j in range(group_size):
            reward = float(rng.integers(0, 4))
            out.append(random_episode(rng, f"ep-g{g}-{j}", f"group-{g}", reward, vocab=vocab, size=size))
    return out


# ---- episodes shaped like the delegation demo and like a long multi-agent trace -------------------


def _lp(rng: np.random.Generator, n: int) -> np.ndarray:
    return -rng.uniform(0.05, 4.0, size=n).astype(np.float32)


def _chat_ids(tokenizer, messages: list[dict], *, generation_prompt: bool = True) -> np.ndarray:
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    return np.asarray(ids, dtype=np.int32)


def delegation_episode(
    tokenizer, rng: np.random.Generator, episode_id: str, group_id: str, reward: float, words: list[str]
) -> Episode:
    """The delegation demo's call structure (harnesses/delegation.py) with its real chat-template
    prompts: the parent's delegating call, one call per worker (its own root context: system prompt
    + its word), the parent's final call continuing the first with the workers' answers as tool
    results. Completions are random tokens of 1-8 tokens (the demo's max_tokens is 8)."""
    from harnesses.delegation_words import PARENT_SYSTEM, WORKER_SYSTEM

    vocab = len(tokenizer)

    def completion() -> np.ndarray:
        return rng.integers(3, vocab, size=int(rng.integers(1, 9))).astype(np.int32)

    def call(cid: str, agent: str, ctx: str, parent: Call | None, prompt: np.ndarray) -> Call:
        c = completion()
        return Call(cid, agent, ctx, parent.call_id if parent else None, prompt, c, _lp(rng, c.size))

    sys_p = {"role": "system", "content": PARENT_SYSTEM}
    p0 = call(
        "parent/c0/000",
        "parent",
        "parent/c0",
        None,
        _chat_ids(tokenizer, [sys_p, {"role": "user", "content": "Words:\n" + "\n".join(words)}]),
    )
    workers = [
        call(
            f"worker-{i + 1}/c0/000",
            f"worker-{i + 1}",
            f"worker-{i + 1}/c0",
            None,
            _chat_ids(
                tokenizer,
                [{"role": "system", "content": WORKER_SYSTEM}, {"role": "user", "content": f"Word:\n{w}"}],
            ),
        )
        for i, w in enumerate(words)
    ]
    answers = [{"role": "tool", "content": tokenizer.decode(w.completion.tolist())} for w in workers]
    observation = _chat_ids(tokenizer, answers)  # the tool turns + the assistant header, appended
    p1 = call(
        "parent/c0/001", "parent", "parent/c0", p0, np.concatenate([p0.prompt, p0.completion, observation])
    )
    return Episode(episode_id, group_id, reward, [p0, *workers, p1])


def delegation_batch(tokenizer, *, tasks: int = 2, group_size: int = 8, seed: int = 0) -> list[Episode]:
    """One demo step: `tasks` tasks x `group_size` episodes (the demo's defaults: 2 x 8)."""
    from harnesses.delegation_words import task_words

    rng = np.random.default_rng(seed)
    out = []
    for t in range(tasks):
        words = task_words(t)
        for j in range(group_size):
            out.append(
                delegation_episode(tokenizer, rng, f"del-{t}-{j}", f"task-{t}", float(rng.uniform()), words)
            )
    return out


def long_prefix_episode(
    rng: np.random.Generator,
    episode_id: str,
    group_id: str,
    reward: float,
    *,
    vocab: int,
    parent_tokens: int = 4096,
    workers: int = 8,
    worker_tokens: int = 2048,
    compactions: int = 2,
    turns: int = 4,  # >= 2
) -> Episode:
    """A multi-agent trace with long shared prefixes: the parent context grows over `turns` calls to
    ~`parent_tokens`; then `workers` subagents fork from it (each worker's context starts with the
    parent's whole context, as a forked subagent inherits it) and add ~`worker_tokens` each over
    `turns` calls; their answers return to the parent; then `compactions` times the parent restarts
    from a summary and runs `turns` more calls. Completions are 1/8 of each turn's new tokens."""
    b = _Builder(rng, vocab, episode_id, 1)

    def toks(n: int) -> np.ndarray:
        return rng.integers(3, vocab, size=max(n, 1)).astype(np.int32)

    def grow(head: Call, total: int) -> Call:
        step = max((total - head.prompt.size - head.completion.size) // (turns - 1), 8)
        for _ in range(turns - 1):
            head = b.extend(head, toks(step - step // 8), completion=toks(step // 8))
        return head

    first = parent_tokens // turns
    head = b.call("parent", "parent/c0", None, toks(first - first // 8), completion=toks(first // 8))
    head = grow(head, parent_tokens)
    spawn = np.concatenate([head.prompt, head.completion])
    answers = []
    for w in range(workers):
        name = f"worker-{w}"
        wh = b.call(
            name,
            f"{name}/c0",
            None,
            np.concatenate([spawn, toks(32)]),
            completion=toks(worker_tokens // turns // 8),
        )
        wh = grow(wh, spawn.size + worker_tokens)
        answers.append(wh.completion)
    head = b.extend(head, np.concatenate(answers))
    for c in range(1, compactions + 1):
        summary = np.concatenate([toks(parent_tokens // 8), head.completion])
        head = b.call("parent", f"parent/c{c}", None, summary, completion=toks(64))
        head = grow(head, parent_tokens // 2)
    return Episode(episode_id, group_id, reward, b.calls)
