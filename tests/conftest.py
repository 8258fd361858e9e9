"""Shared pytest fixtures. Each real service's fixtures live in tests/fixtures/<service>.py."""

pytest_plugins = [
    "tests.fixtures.models",
    "tests.fixtures.s3",
    "tests.fixtures.temporal",
    "tests.fixtures.worker",
    "tests.fixtures.agents_script",
]
