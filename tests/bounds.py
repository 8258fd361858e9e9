"""Bounds of tests that run real services (Temporal dev server, vLLM, S3 server, harness processes).

A bound only turns a hang into a failure; it never checks speed (benchmarks in bench/ do). On a loaded
2-core machine the same work takes many times its idle time (docs/results.md section 5). Every wait is
on a moment the test creates or a state it is sure to reach, and the durability kit's waits fail at
once when the process they wait on dies, so a generous bound costs little when something is wrong.
"""

from __future__ import annotations

# A state the test is sure to reach: a worker polling its queue, a gate held, a listing complete.
STATE_WAIT = 900.0
# A run or an episode the test is sure to see finish.
RESULT_WAIT = 900.0
# A fresh Python interpreter the test runs to its end (a subprocess that imports torch, vLLM or pytest):
# under heavy load starting one can take minutes (docs/results.md section 5).
PROCESS_WAIT = STATE_WAIT
# pytest-timeout of a test that starts services (fixture setup included, as pytest-timeout counts it):
# services up within STATE_WAIT, then the test's own waits and work.
SERVICE_TEST_TIMEOUT = 1800
