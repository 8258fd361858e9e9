"""Connecting to Temporal the way every grove process must: with the pydantic data converter."""

from __future__ import annotations

import os

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

DEFAULT_ADDRESS = "127.0.0.1:7233"


def temporal_address() -> str:
    return os.environ.get("GROVE_TEMPORAL_ADDRESS", DEFAULT_ADDRESS)


async def connect(address: str | None = None, namespace: str = "default") -> Client:
    """A client whose payloads are pydantic v2 models (client and workers must agree on this)."""
    return await Client.connect(
        address or temporal_address(), namespace=namespace, data_converter=pydantic_data_converter
    )
