"""The demo watches its runs through a real dev server: a server that does not answer (stopped here, as a
stalled one answers UNAVAILABLE) is asked again next round, never the end of the demo; a run the server
does not know is still an error."""

from __future__ import annotations

import pytest
from temporalio.service import RPCError, RPCStatusCode

from cli.demo import history_of
from grove.client import connect
from infra.temporal import TemporalDevServer

pytestmark = pytest.mark.slow  # its own dev server


async def test_an_unanswering_server_is_asked_again_and_an_unknown_run_is_an_error(tmp_path):
    server = TemporalDevServer(tmp_path / "temporal").start()
    try:
        client = await connect(server.address)
        handle = client.get_workflow_handle("no-such-run")
        with pytest.raises(RPCError) as err:
            await history_of(handle)
        assert err.value.status == RPCStatusCode.NOT_FOUND
    finally:
        server.stop()
    assert await history_of(handle) is None  # the server is gone: no answer this round
