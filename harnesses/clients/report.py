"""What a harness program prints when its episode is closed: the episode, its accounting, its rows, and
the agents the responses named, so a user running an example sees what grove recorded.

    closed = await episode.aclose(final_answer=answer, wait=True)
    print(episode_report(episode, closed))

    episode   gw-demo/s000001/t0/g0  ok  reward 0.25
    calls     selected 6, auxiliary 1  (every call the episode made, by how it ended)
    rows      4 rows, 57 tokens with loss  (staging/.../rows.parquet)
    agents    parent (last call parent.0.c1), worker-1 (worker-1.0.c1), worker-2 (worker-2.1.c0)

Light: only the episode binding and the close response (the gateway's CloseResponse as JSON).
"""

from __future__ import annotations

from typing import Any

from harnesses.clients import Episode


def episode_report(episode: Episode, closed: dict[str, Any]) -> str:
    """Lines describing a closed episode; `closed`: the close response of `aclose(..., wait=True)`."""
    result = closed.get("result") or {}
    lines = [f"episode   {closed.get('episode_id', '?')}  {result.get('status', 'closed, not waited for')}"]
    if result:
        lines[0] += f"  reward {result.get('reward', 0.0):.3f}"
        if result.get("failure"):
            lines.append(f"failure   {result['failure']}")
        counts = ", ".join(f"{state} {n}" for state, n in result.get("counts", {}).items())
        lines.append(f"calls     {counts or 'none'}  (every call the episode made, by how it ended)")
        lines.append(
            f"rows      {result.get('num_rows', 0)} rows, {result.get('eligible_tokens', 0)} tokens with loss"
            f"  ({result.get('rows_key', '-')})"
        )
    agents = ", ".join(f"{a} (last call {c})" for a, c in sorted(episode.last_calls().items()))
    lines.append(f"agents    {agents or 'none named in responses'}")
    return "\n".join(lines)
