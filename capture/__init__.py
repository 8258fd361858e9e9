"""The exact-capture core that the gateway and the activities share, below both.

    capture.prompt   a call's exact prompt ids from its PromptSpec: the one assembly the generate
                     activity samples from and the gateway measures
    capture.claims   claim checks: chat prompts, conversations and large completions in the object store,
                     Temporal carrying their references (size + sha256, verified on read)
    capture.records  chat records: what a harness got for each call, kept beside its staged arrays

Imports only the vocabulary below it (grove/, chat/, storage/, grove/staging_format.py), never
gateway/ or activities/.
"""
