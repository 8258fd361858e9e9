"""The restore's refusal of ledger queries and the bounded wait of whoever asks (grove/ledger_restoring.py),
without services: the end-to-end behaviour is tests/episodes/test_restoring_queries.py."""

from __future__ import annotations

import pytest

from grove.ledger_restoring import ask_while_restoring, is_restoring, restoring_message


class Refused(Exception):
    pass


def test_the_refusal_names_the_episode_the_query_and_the_pages() -> None:
    message = restoring_message("r/s000001/t0/g0", "context_view", 2, 7)
    assert message.startswith("LedgerRestoring: episode 'r/s000001/t0/g0' is restoring its ledger")
    assert "(2 of 7 pages loaded)" in message and "the context_view query" in message
    assert is_restoring(message)
    assert not is_restoring("episode 'x': the summary query failed: LedgerRestoring: quoted")


async def test_a_refusal_is_asked_again_until_the_answer_comes() -> None:
    answers: list[object] = [Refused("restoring"), Refused("restoring"), "whole"]
    waited: list[str] = []

    async def ask() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return str(answer)

    got = await ask_while_restoring(
        ask, lambda e: isinstance(e, Refused), on_wait=lambda e: waited.append(str(e))
    )
    assert got == "whole" and waited == ["restoring", "restoring"]


async def test_the_wait_is_bounded_and_other_errors_are_not_waited_out() -> None:
    asked = []

    async def refused() -> str:
        asked.append(1)
        raise Refused("still restoring")

    with pytest.raises(Refused, match="still restoring"):
        await ask_while_restoring(refused, lambda e: isinstance(e, Refused), patience=0.0)
    assert len(asked) == 1

    async def broken() -> str:
        raise ValueError("another failure")

    waited: list[BaseException] = []
    with pytest.raises(ValueError, match="another failure"):
        await ask_while_restoring(broken, lambda e: isinstance(e, Refused), on_wait=waited.append)
    assert waited == []
