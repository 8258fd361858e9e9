"""Every model build reports its progress (models/progress.py): step, loss, elapsed time and ETA, on a
schedule of steps and seconds, to its listeners (`grove model init` prints them). The clock is the
test's own, so the ETA is exact."""

from __future__ import annotations

import models.progress as progress_module
from models.progress import EVERY_S, EVERY_STEPS, BuildProgress, listen_to_progress


def test_a_build_reports_step_loss_and_eta_on_schedule(monkeypatch):
    monkeypatch.setattr(progress_module, "_listeners", [])  # this test's listener only
    now = [0.0]
    heard: list[str] = []
    remove = listen_to_progress(heard.append)
    try:
        progress = BuildProgress("tiny build", 100, clock=lambda: now[0])
        for step in range(100):
            now[0] += 2.0  # two seconds a step
            progress.report(step, 1.0 / (step + 1))
    finally:
        remove()
    # step 0, every EVERY_STEPS-th step, every EVERY_S seconds, the last step
    assert heard[0] == "tiny build: step 1/100 loss 1.0000, 2s elapsed, ETA 3m18s"
    assert heard[-1] == "tiny build: step 100/100 loss 0.0100, 3m20s elapsed, ETA 0s"
    assert "step 26/100" in heard[2] and len(heard) >= 100 * 2.0 / EVERY_S
    assert all("ETA" in line for line in heard) and EVERY_STEPS < 100


def test_a_build_of_named_steps_says_each_as_it_ends(monkeypatch):
    monkeypatch.setattr(progress_module, "_listeners", [])
    now = [0.0]
    heard: list[str] = []
    remove = listen_to_progress(heard.append)
    try:
        progress = BuildProgress("smollm2 conversion", 4, clock=lambda: now[0])
        for step, (seconds, what) in enumerate([(6.0, "read"), (15.0, "dequantized"), (3.0, "moved")]):
            now[0] += seconds
            progress.done(step, what)
    finally:
        remove()
    assert heard == [
        "smollm2 conversion: step 1/4 read, 6s elapsed, ETA 18s",
        "smollm2 conversion: step 2/4 dequantized, 21s elapsed, ETA 21s",
        "smollm2 conversion: step 3/4 moved, 24s elapsed, ETA 8s",
    ]
