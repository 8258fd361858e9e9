"""Episodes as *calls* for the learner tests and the benchmark, and the rows built from them.

`random_episode` grows a multi-agent episode the way a harness would: a parent context whose calls
continue each other (prompt = previous prompt + completion + new observation), worker contexts
spawned by parent calls whose answers come back into the parent as observations, compaction (a
rewrite: a new root whose prompt is a summary), kept forks (two selected calls extending one
ancestor), discarded retries and auxiliary calls.

`rows_from_calls` is a small test-local reconstruction (endpoint rows, ownership by the first
endpoint in canonical order among a call's descendants), used until trainer/forest.py's
`reconstruct` exists. The per-call reference in test_reference.py never uses rows: it reads calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

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
    def __init__(self, rng: np.random.Generator, vocab: int, episode_id: str) -> None:
        self.rng, self.vocab, self.episode_id = rng, vocab, episode_id
        self.calls: list[Call] = []
        self.counters: dict[str, int] = {}

    def tokens(self, lo: int, hi: int) -> np.ndarray:
        return self.rng.integers(3, self.vocab, size=int(self.rng.integers(lo, hi + 1))).astype(np.int32)

    def call(self, agent: str, context: str, parent: Call | None, prompt: np.ndarray, **kw) -> Call:
        n = self.counters.get(context, 0)
        self.counters[context] = n + 1
        completion = self.tokens(2, 8)
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
    rng: np.random.Generator, episode_id: str, group_id: str, reward: float, *, vocab: int, size: int = 3
) -> Episode:
    """A random multi-agent episode with about `size` parent turns (see the module docstring)."""
    b = _Builder(rng, vocab, episode_id)
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


def rows_from_calls(ep: Episode) -> list[Row]:
    """Endpoint rows of an episode's selected calls; each eligible call owned by exactly one row."""
    by_id = {c.call_id: c for c in ep.calls}
    selected = sorted((c for c in ep.calls if c.selected), key=lambda c: c.call_id)
    has_child = {c.parent_call_id for c in selected if c.parent_call_id}
    endpoints = [c for c in selected if c.call_id not in has_child]
    paths = {}
    for e in endpoints:
        path, node = [], e
        while node is not None:
            path.append(node)
            node = by_id[node.parent_call_id] if node.parent_call_id else None
        paths[e.call_id] = path[::-1]
    owner: dict[str, str] = {}
    for e in endpoints:  # canonical order: the first endpoint below a call owns it
        for c in paths[e.call_id]:
            owner.setdefault(c.call_id, e.call_id)
    rows = []
    for e in endpoints:
        ids = np.concatenate([e.prompt, e.completion])
        mask = np.zeros(ids.size, dtype=bool)
        blp = np.zeros(ids.size, dtype=np.float32)
        spans = []
        for c in paths[e.call_id]:
            start = c.prompt.size
            end = start + c.completion.size
            assert np.array_equal(ids[start:end], c.completion), "continuation broken in the generator"
            owned = owner[c.call_id] == e.call_id
            spans.append(Span(c.call_id, c.agent, start, end, owned, c.eligible, 0))
            if owned and c.eligible:
                mask[start:end] = True
                blp[start:end] = c.logprobs
        rows.append(
            Row(
                row_id=f"{ep.episode_id}#{e.call_id}",
                episode_id=ep.episode_id,
                group_id=ep.group_id,
                input_ids=ids.astype(np.int32),
                loss_mask=mask,
                behavior_logprobs=blp,
                spans=tuple(spans),
                reward=ep.reward,
                valid=ep.valid,
            )
        )
    return rows


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
