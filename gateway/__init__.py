"""The capture gateway: the HTTP front that records external harnesses into episodes.

Four rooms, each importing only the rooms below it:

    gateway.http      the web surface: the app and its lifespan, routes (wire formats and management),
                      the wire adapters (gateway/http/wire/: each parses into the canonical request and
                      renders the result back, in its own error shape), auth, settings, dependencies,
                      delivery on the connection, the embedded server, the `gateway` command
    gateway.pipeline  one captured call, whatever wire format carried it: the `Capture` service and its
                      `Planner` (identity from grove's headers or a harness's own: OpenCode,
                      Claude Code; routing to a context, retry, continuation, rewrite),
                      `Execution` (the episode's Updates, the chat record) and `Relaunch` (answers from
                      records), delivery settled in the ledger, hints and advice
    gateway.intake    what is checked before anything is admitted: limits, large-body admission and
                      decoding, prompt measurement off the loop, the context window; the canonical
                      request (gateway/intake/capture_request.py) and each wire format's request
    gateway.temporal  the episode workflows as the gateway sees them: queries and Updates with Temporal's
                      answers turned into named errors, which answers are retried, waiting for a worker

A request's path (chat completions): gateway/http/routes/openai.py (its body checked by
gateway/intake/chat_request.py into a `CaptureRequest`) -> gateway/pipeline/capture.py (replay, plan,
execute) -> gateway/temporal/episode_client.py (the Updates) -> the chat record rendered back by
gateway/http/wire/chat_completions.py and sent by gateway/http/delivered_response.py. A new wire format
adds its request (intake), its adapter (gateway/http/wire/) and its route; the pipeline stays as it is:
Anthropic Messages is gateway/intake/messages_request.py, gateway/http/wire/anthropic_messages.py and
gateway/http/routes/anthropic.py.
The Responses API is such a wire format too: gateway/intake/responses_request.py and responses_chat.py
(its items as chat messages), gateway/http/wire/responses.py, gateway/http/routes/responses.py.
"""
