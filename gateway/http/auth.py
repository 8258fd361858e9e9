"""Per-episode bearer tokens that need no gateway state: token = "grove-" + HMAC-SHA256(secret, episode id).

Whoever starts an external episode calls `issue_token(secret, episode_id)` and hands the token to the
harness (as its OpenAI API key). The gateway recomputes the token from the URL's episode id, so it
keeps no token table and a restarted gateway accepts the same tokens. A missing or malformed token is
401; a well-formed token that is not this episode's (another episode's, or forged) is 403. Both are
decided before anything talks to Temporal.
"""

from __future__ import annotations

import hashlib
import hmac
import re

TOKEN_PREFIX = "grove-"
_TOKEN = re.compile(r"^grove-[0-9a-f]{64}$")


class AuthError(Exception):
    """Base of the gateway's authentication errors."""


class MissingTokenError(AuthError):
    """No `Authorization: Bearer ...` header."""


class MalformedTokenError(AuthError):
    """An Authorization header that is not `Bearer grove-<64 hex digits>`."""


class WrongEpisodeTokenError(AuthError):
    """A well-formed token that is not the token of the episode in the URL."""


def issue_token(secret: str, episode_id: str) -> str:
    """The bearer token of `episode_id` under `secret`."""
    digest = hmac.new(secret.encode(), episode_id.encode(), hashlib.sha256).hexdigest()
    return TOKEN_PREFIX + digest


def bearer_token(authorization: str | None) -> str:
    """The token of an `Authorization` header value; MissingTokenError / MalformedTokenError otherwise."""
    if not authorization:
        raise MissingTokenError(
            "no Authorization header; send `Authorization: Bearer <the episode's token>` (the OpenAI "
            "client's api_key) or `x-api-key: <the episode's token>` (the Anthropic client's), issued by "
            "gateway.http.auth.issue_token"
        )
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not _TOKEN.match(token):
        raise MalformedTokenError(
            "the Authorization header is not `Bearer grove-<64 hex digits>`; use the token issued for "
            "this episode by gateway.http.auth.issue_token"
        )
    return token


def check_token(secret: str, episode_id: str, authorization: str | None) -> None:
    """Raise unless `authorization` carries exactly `episode_id`'s token."""
    token = bearer_token(authorization)
    if not hmac.compare_digest(token, issue_token(secret, episode_id)):
        raise WrongEpisodeTokenError(
            f"the bearer token is not valid for episode {episode_id!r} (it belongs to another episode or "
            "to another gateway secret); use the token issued for this episode"
        )
