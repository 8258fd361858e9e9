"""Every sampling parameter the learner cannot mirror (grove/sampling.py UNMIRRORABLE) is refused
by the gateway's request parser, by name, before anything is admitted (the parser runs before the
episode is touched; tests/gateway/test_app_e2e.py checks the 400 and the unchanged ledger end to end).
This ties the gateway's list to the one SamplingConfig refuses, so the two cannot drift apart."""

from __future__ import annotations

import pytest

from gateway.intake.chat_request import InvalidChatRequestError, UnsupportedParameterError, parse_chat_request
from grove.sampling import UNMIRRORABLE

VALUES = {
    "top_k": 5,
    "min_p": 0.1,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "repetition_penalty": 1.2,
    "logit_bias": {"5": 10},
    "allowed_token_ids": [1, 2],
    "bad_words": ["x"],
    "min_tokens": 4,
    "guided_decoding": {"json": {}},
    "structured_outputs": {"json": {}},
}


def test_every_unmirrorable_parameter_has_a_case():
    assert set(VALUES) == set(UNMIRRORABLE)


@pytest.mark.parametrize("name", sorted(UNMIRRORABLE))
def test_the_gateway_refuses_each_unmirrorable_parameter(name):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], name: VALUES[name]}
    with pytest.raises(UnsupportedParameterError) as err:
        parse_chat_request(body, "m")
    assert err.value.param == name


@pytest.mark.parametrize("name", ["temperature", "top_p", "max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_is_not_a_number(name, value):
    """JSON `true` is not a number (pydantic would take it as 1): refused, naming the field."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], name: value}
    with pytest.raises(InvalidChatRequestError) as err:
        parse_chat_request(body, "m")
    assert err.value.param == name and "boolean" in str(err.value)
