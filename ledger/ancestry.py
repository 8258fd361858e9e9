"""Evidence-based parent lookup: which completed call does a new prompt extend?

The workflow never sees token arrays, only their sha256 digests. To find a new call's parent, the
gateway (which holds the new prompt's tokens) hashes the slices of its prompt that the ledger asks
for — for each candidate call, `[0, prompt_len)` and `[prompt_len, prompt_len + completion_len)` —
and sends the digests as `AncestryEvidence`. A candidate matches when both slices hash to its
receipt's prompt and completion digests, i.e. the new prompt starts with candidate.prompt +
candidate.completion. The longest match is the parent; two different candidates with the same
longest match make the ancestry ambiguous (the ledger raises; it never guesses).

Digests are sha256 of little-endian int32 ids, as in grove/staging_format.py.

Pure module: pydantic + stdlib only (imported inside the Temporal workflow sandbox).
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, Field

from grove.receipts import CallReceipt


class SliceDigest(BaseModel):
    """sha256 of the little-endian int32 bytes of prompt_ids[start:end]."""

    start: int = Field(ge=0)
    end: int = Field(ge=0)
    sha256: str


class AncestryEvidence(BaseModel):
    """What the gateway knows about a new prompt: its length and the digests of the requested slices."""

    prompt_len: int = Field(ge=0)
    slices: list[SliceDigest]

    def digest_of(self, start: int, end: int) -> str | None:
        for piece in self.slices:
            if piece.start == start and piece.end == end:
                return piece.sha256
        return None


def _le_int32_bytes(ids: Sequence[int]) -> bytes:
    packed = array("i", ids)
    if packed.itemsize != 4:  # pragma: no cover - 'i' is 4 bytes on every platform grove runs on
        raise RuntimeError(f"array('i') has itemsize {packed.itemsize}; expected 4")
    if sys.byteorder == "big":  # pragma: no cover - digests are defined on little-endian bytes
        packed.byteswap()
    return packed.tobytes()


def ancestry_evidence(prompt_ids: Sequence[int], ranges: Iterable[tuple[int, int]]) -> AncestryEvidence:
    """Hash the slices `ranges` of `prompt_ids`; ranges past the prompt's end are skipped (cannot match)."""
    ids = list(prompt_ids)
    wanted = sorted({(s, e) for s, e in ranges if 0 <= s <= e <= len(ids)})
    return AncestryEvidence(
        prompt_len=len(ids),
        slices=[
            SliceDigest(start=s, end=e, sha256=hashlib.sha256(_le_int32_bytes(ids[s:e])).hexdigest())
            for s, e in wanted
        ],
    )


def candidate_ranges(candidates: Iterable[CallReceipt]) -> list[tuple[int, int]]:
    """The slices the gateway must hash so that every completed candidate can be checked."""
    ranges: set[tuple[int, int]] = set()
    for receipt in candidates:
        if receipt.digests is None:
            continue
        p, c = receipt.digests.prompt_len, receipt.digests.completion_len
        ranges.update({(0, p), (p, p + c)})
    return sorted(ranges)


@dataclass(frozen=True)
class AncestryMatch:
    """Result of matching candidates against evidence."""

    longest: list[str]  # call ids of the candidates with the longest matching prefix (>1: ambiguous)
    length: int  # that prefix length (prompt + completion of the match); 0 when nothing matched
    missing: list[tuple[int, int]]  # slices the evidence should have had but did not


def match_candidates(candidates: Iterable[CallReceipt], evidence: AncestryEvidence) -> AncestryMatch:
    """Candidates whose prompt + completion is a prefix of the evidenced prompt, longest first."""
    best: list[str] = []
    best_len = 0
    missing: set[tuple[int, int]] = set()
    for receipt in candidates:
        digests = receipt.digests
        if digests is None:
            continue
        p, total = digests.prompt_len, digests.prompt_len + digests.completion_len
        if total > evidence.prompt_len:
            continue  # longer than the new prompt: cannot be its prefix
        head, tail = evidence.digest_of(0, p), evidence.digest_of(p, total)
        if head is None or tail is None:
            missing.update(r for r, d in (((0, p), head), ((p, total), tail)) if d is None)
            continue
        if head != digests.prompt_sha256 or tail != digests.completion_sha256:
            continue
        if total > best_len or not best:
            best, best_len = [receipt.call_id], total
        elif total == best_len:
            best.append(receipt.call_id)
    return AncestryMatch(longest=sorted(best), length=best_len, missing=sorted(missing))
