"""The UI link `grove run start|status` print: the UI of the server grove started at the client's address
(a demo's `--ui-port`), not always the default port."""

from __future__ import annotations

from cli.runs import DEFAULT_UI, ui_url
from infra.stack import ServiceRecord, StackState, save_state


def _record(address: str, ui: str) -> None:
    rec = ServiceRecord(name="temporal", pid=1, address=address, ui_url=ui, log="-")
    save_state(StackState(services={"temporal": rec}))


async def test_the_ui_link_follows_the_recorded_server_at_the_clients_address(
    temporal_client, temporal_server, tmp_path, monkeypatch
):
    monkeypatch.setenv("GROVE_HOME", str(tmp_path))
    monkeypatch.delenv("GROVE_TEMPORAL_UI", raising=False)
    page = "/namespaces/default/workflows/run%2F1"
    assert ui_url("run/1", temporal_client) == DEFAULT_UI + page  # nothing recorded
    _record(temporal_server.address, "http://127.0.0.1:8494")
    assert ui_url("run/1", temporal_client) == "http://127.0.0.1:8494" + page
    _record("127.0.0.1:1", "http://127.0.0.1:8495")  # another server's record says nothing about this one
    assert ui_url("run/1", temporal_client) == DEFAULT_UI + page
    monkeypatch.setenv("GROVE_TEMPORAL_UI", "http://ui.example:80/")
    assert ui_url("run/1", temporal_client) == "http://ui.example:80" + page
