"""Episode references in URLs: base64url (no padding) of the episode id.

Episode ids contain '/' (`{run}/s{step}/t{task}/g{j}`), so they cannot be a path segment as they are.
A harness gets `base_url = http://host/episodes/<ref>/v1` and any unmodified OpenAI client then
sends every request of that episode under the episode's own path (agent-lightning's pattern).
"""

from __future__ import annotations

import base64
import binascii
import re

_REF = re.compile(r"^[A-Za-z0-9_-]+$")


class InvalidEpisodeRefError(ValueError):
    """A URL's episode reference that is not base64url of a UTF-8 episode id."""


def episode_ref(episode_id: str) -> str:
    """The URL-safe reference of `episode_id` (base64url, padding stripped)."""
    if not episode_id:
        raise InvalidEpisodeRefError("an episode id must be non-empty to have a reference")
    return base64.urlsafe_b64encode(episode_id.encode()).decode().rstrip("=")


def episode_id_of(ref: str) -> str:
    """Decode a reference made by `episode_ref`; anything else raises InvalidEpisodeRefError."""
    if not _REF.match(ref) or len(ref) % 4 == 1:
        raise InvalidEpisodeRefError(
            f"episode reference {ref!r} is not base64url without padding; build the URL with "
            "gateway.http.episode_ref.episode_ref(episode_id)"
        )
    try:
        episode_id = base64.urlsafe_b64decode(ref + "=" * (-len(ref) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise InvalidEpisodeRefError(
            f"episode reference {ref!r} does not decode to a UTF-8 episode id; build the URL with "
            "gateway.http.episode_ref.episode_ref(episode_id)"
        ) from None
    if episode_ref(episode_id) != ref:  # non-canonical encodings (stray bits) name no episode
        raise InvalidEpisodeRefError(
            f"episode reference {ref!r} is not the canonical reference of {episode_id!r} "
            f"({episode_ref(episode_id)!r}); build the URL with gateway.http.episode_ref.episode_ref"
        )
    return episode_id
