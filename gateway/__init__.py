"""The capture gateway: the HTTP front that records external harnesses into episodes.

Four rooms, each importing only the rooms below it:

    gateway.http      the web surface: the app and its lifespan, routes (wire formats and management),
                      auth, settings, dependencies, response rendering and delivery on the connection,
                      the embedded server, the `gateway` command
    gateway.pipeline  one captured call, whatever wire format carried it: identity, routing to a context,
                      planning (retry, continuation, rewrite), execution through the episode's Updates,
                      relaunch answered from records, delivery settled in the ledger, hints and advice
    gateway.intake    what is checked before anything is admitted: limits, large-body admission and
                      decoding, prompt measurement off the loop, the context window, the chat request
    gateway.temporal  the episode workflows as the gateway sees them: queries and Updates with Temporal's
                      answers turned into named errors, which answers are retried, waiting for a worker

A request's path: gateway/http/routes/openai.py -> gateway/pipeline/capture.py (plan, execute) ->
gateway/temporal/episode_client.py (the Updates) -> back through gateway/http/delivered_response.py.
"""
