"""The `x-grove-*` HTTP header names: one definition, read by the gateway and written by the clients.

Request headers (a harness sends them; gateway/pipeline/identity.py reads them, docs/gateway.md describes
them):

    AGENT_HEADER           x-grove-agent            the agent (default "parent")
    CONTEXT_HEADER         x-grove-context          an explicit context id
    SPAWNED_BY_HEADER      x-grove-spawned-by       the call whose response spawned this worker
    PARENT_CONTEXT_HEADER  x-grove-parent-context   or: the context whose head spawned it
    REWRITE_HEADER         x-grove-rewrite          this request rewrites the agent's history
    KIND_HEADER            x-grove-call-kind        not a policy action: `summary` (the summary of the
                                                    agent's context: trained when the run trains
                                                    summaries), `title` or `auxiliary` (never trained)
    LAUNCH_HEADER          x-grove-launch           which launch of a runner-launched harness sent it
                                                    (gateway/pipeline/launch_records.py)

Response headers (the gateway sets them, gateway/http/wire/adapter.py): CALL_ID_HEADER, CONTEXT_HEADER and
AGENT_HEADER name where the call went; WARNING_HEADER carries advice about the harness's traffic
(gateway/pipeline/advice.py).

Stdlib only and importing nothing: harnesses/clients/ (which a harness process imports without the rest
of grove) takes its names from here.
"""

AGENT_HEADER = "x-grove-agent"
CONTEXT_HEADER = "x-grove-context"
SPAWNED_BY_HEADER = "x-grove-spawned-by"
PARENT_CONTEXT_HEADER = "x-grove-parent-context"
REWRITE_HEADER = "x-grove-rewrite"
KIND_HEADER = "x-grove-call-kind"
LAUNCH_HEADER = "x-grove-launch"
CALL_ID_HEADER = "x-grove-call-id"
WARNING_HEADER = "x-grove-warning"
