"""Wire formats: the HTTP APIs the gateway speaks, each a thin adapter over the one capture pipeline.

A wire format parses its body (and headers) into the canonical request
(gateway/intake/capture_request.py), hands it to the pipeline (gateway/pipeline/capture.py), and
renders the call's chat record back as its JSON body or its stream events; its refusals take its own
error shape. The parts:

    refusal.py           a refusal as every wire format sees it (status, kind, message, param) and the
                         `ErrorShape` a wire format renders it in
    adapter.py           `WireAdapter` (what a wire format provides) and `answer`: the delivered response
                         of a captured call, whatever its wire format (gateway/http/delivered_response.py)
    chat_completions.py  OpenAI chat completions: its error shape and its rendering
                         (gateway/http/chat_response.py); its request is gateway/intake/chat_request.py,
                         its route gateway/http/routes/openai.py
    anthropic_messages.py  Anthropic Messages: its error shape and its message and event rendering; its
                         request is gateway/intake/messages_request.py (blocks:
                         gateway/intake/messages_blocks.py), its route gateway/http/routes/anthropic.py
    responses.py         the OpenAI Responses API (Codex CLI): its error shape (a refused stream ends
                         with `response.failed`) and its rendering (gateway/http/responses_response.py);
                         its request is gateway/intake/responses_request.py and responses_chat.py, its
                         route gateway/http/routes/responses.py
"""
