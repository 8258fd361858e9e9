"""Fixtures of the durability tests: one killable grove stack (dev server + worker processes) per package."""

from __future__ import annotations

import pytest

from tests.durability.helpers import DurabilityStack


@pytest.fixture(scope="package")
async def stack(tmp_path_factory, tiny_model_dir):
    s = DurabilityStack(tmp_path_factory.mktemp("durability"), tiny_model_dir)
    try:
        yield s
    finally:
        s.down()
