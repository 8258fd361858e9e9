"""The model's chat format: template rendering with exact-prefix splice, tool calls, content tokens."""
