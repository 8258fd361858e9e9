# Developer shortcuts over the project's own scripts (CONTRIBUTING.md says which tests run where).
#   make check   static checks: ruff lint, ruff format check, mypy (infra/check.sh)
#   make unit    the pure tests: no Temporal, S3, vLLM or model build (about a minute on two cores)
#   make test    the default suite against real services (bash infra/test.sh: the README's test command)
#   make long    the long suite (bash infra/test.sh -m long)
#   make ci      what CI runs on a fresh clone (.ci/run)

VENV ?= .venv
PYTEST = HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(VENV)/bin/python -m pytest -q -p no:cacheprovider

# Pure tests only: the ledger, reconstruction, chat templates, capture, the gateway's pure rules, the loss
# and advantages, configs and the repository's own checks. Anything that starts a service is elsewhere.
UNIT = tests/ledger tests/forest tests/chat tests/capture tests/episodes/test_units.py tests/episodes/test_restoring_units.py \
	tests/gateway/test_app_units.py tests/gateway/test_continuation_units.py \
	tests/gateway/test_launch_records_units.py tests/gateway/test_input_limits.py \
	tests/gateway/test_opencode_names.py tests/gateway/test_sampling_refusals.py \
	tests/gateway/test_advice.py tests/gateway/test_responses_units.py tests/gateway/test_codex_identity.py tests/learner/test_advantages.py tests/learner/test_loss.py \
	tests/learner/test_config.py tests/learner/test_data_order.py tests/learner/test_off_policy.py \
	tests/learner/test_episode_records.py tests/runs/test_runconfig.py tests/runs/test_parent_agent.py \
	tests/harnesses/test_agents_handoffs.py tests/harnesses/test_delegation.py tests/harnesses/test_codex_setup.py \
	tests/infra/test_cited_paths.py tests/storage/test_store_layout.py

.PHONY: venv check unit test long ci

venv:
	bash infra/bootstrap.sh

check: venv
	bash infra/check.sh

unit: venv
	$(PYTEST) $(UNIT)

test:
	bash infra/test.sh

long:
	bash infra/test.sh -m long

ci:
	bash .ci/run
