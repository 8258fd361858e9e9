"""The test gates of grove/gates.py: held keys stay held until released, others pass, off unless enabled."""

from __future__ import annotations

import asyncio
import threading

from grove.gates import ENV, GateControl, GatedStore, Gates
from storage.local import LocalStore


def test_gates_are_off_unless_the_env_var_names_a_folder(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV, raising=False)
    assert Gates.from_env() is None
    monkeypatch.setenv(ENV, str(tmp_path))
    assert Gates.from_env().root == tmp_path


async def test_a_matching_key_is_held_until_released_and_others_pass(tmp_path):
    control, gates = GateControl(tmp_path), Gates(tmp_path)
    await gates.hold("generate", "ep/call/attempt-1")  # not armed: passes
    control.arm("generate", r"/worker-[^/]*/[^/]*$")
    await gates.hold("generate", "ep/parent.0.c0/attempt-1")  # armed, no match: passes
    held = asyncio.create_task(gates.hold("generate", "ep/worker-1.0.c0/attempt-1"))
    other = asyncio.create_task(gates.hold("generate", "ep/worker-2.0.c0/attempt-1"))
    while len(control.held("generate")) < 2:  # both announce themselves, then stay
        await asyncio.sleep(0.001)
    assert control.held("generate") == ["ep/worker-1.0.c0/attempt-1", "ep/worker-2.0.c0/attempt-1"]
    control.release("generate", "ep/worker-1.0.c0/attempt-1")
    await asyncio.wait_for(held, 5)
    assert not other.done()
    control.disarm("generate")  # releases the rest
    await asyncio.wait_for(other, 5)


def test_the_gated_store_holds_after_writing_the_object(tmp_path):
    control = GateControl(tmp_path / "gates")
    store = GatedStore(LocalStore(tmp_path / "store"), Gates(control.root))
    control.arm("store_put", r"^ck/step-2/a$")
    store.put("ck/step-1/a", b"1")  # no match
    writer = threading.Thread(target=lambda: (store.put("ck/step-2/a", b"2"), store.put("ck/step-2/b", b"3")))
    writer.start()
    while not control.held("store_put"):
        writer.join(0.001)
    assert store.get("ck/step-2/a") == b"2" and not store.exists("ck/step-2/b")  # written, then held
    control.disarm("store_put")
    writer.join(5)
    assert store.get("ck/step-2/b") == b"3"


def test_the_gated_store_holds_before_a_write_and_gates_put_if_absent(tmp_path):
    control = GateControl(tmp_path / "gates")
    store = GatedStore(LocalStore(tmp_path / "store"), Gates(control.root))
    control.arm("store_before_put", r"^rows/")
    writer = threading.Thread(target=lambda: store.put_if_absent("rows/ep.parquet", b"rows"))
    writer.start()
    while not control.held("store_before_put"):
        writer.join(0.001)
    assert not store.exists("rows/ep.parquet")  # held before the write
    control.arm("store_put", r"^rows/")
    control.disarm("store_before_put")
    while not control.held("store_put"):
        writer.join(0.001)
    assert store.get("rows/ep.parquet") == b"rows"  # written, then held after
    control.disarm("store_put")
    writer.join(5)
    assert not writer.is_alive()
