"""The object store's layout: every key grove reads or writes, built here and nowhere else (pure).

Every piece of data has one deterministic home, a function of the ids it belongs to, so a retried
activity finds its own work and a reader needs no index. The keys are a contract with stores written
by earlier versions (a resumed run, a closed episode's rows): a key string never changes
(tests/storage/test_store_layout.py pins them). Ids are episode ids `{run}/s{step:06d}/t{task}/g{j}` (any
`/`-separated id for a hand-run episode), call ids, run ids; `{sha16}` is the first 16 hex digits of the
object's sha256.

How a key is written: *once* = `put_if_absent`, a write that finds the key verifies its bytes instead of
rewriting (a retry finds its own work); *marker* = the objects under a prefix are written first and a
`COMMIT` manifest of their sha256 last, readers see only what a marker lists (a crash mid-write leaves
nothing visible); *latest* = `put`, the newest write wins (state that changes, never trained from).

Staging, one folder per episode, deleted when the episode ends (the `clean_staging` activity, unless
the spec keeps it):

| key | what lives there | written by | read by | how |
| --- | --- | --- | --- | --- |
| `staging/{episode}/{call}.safetensors` | a call's token arrays (grove/staging_format.py) | generate activity (activities/generate.py) | materialize, continuations' prompts (capture/prompt.py), the gateway's prompt measurement, the call archive | once |
| `staging/{episode}/{call}.receipt-{sha256}.json` | what the arrays were sampled with (`StagedReceipt`), written before them | generate activity | a retried generate that finds the arrays staged | once |
| `staging/{episode}/{call}.chat.json` | the gateway's chat record of a call (capture/records.py) | gateway | gateway (continuation, relaunch), reward (agents' outputs), call archive | once |
| `staging/{episode}/requests/{call}-{sha16}.json` | a chat prompt claim-checked out of an Update (capture/claims.py) | gateway | generate activity | once |
| `staging/{episode}/conversations/{call}-{sha16}.json` | a native chat call's conversation, for its continuation's delta | generate activity | generate activity of the continuation | once |
| `staging/{episode}/completions/{call}-{sha16}.json` | a completion too large to cross Temporal inline | generate activity | gateway, `load_completion` activity | once |
| `staging/{episode}/prompts/{digest}/{call}` | empty: the prompt index of relaunch replay (gateway/pipeline/launch_records.py) | gateway | gateway (a relaunched harness's requests) | once |
| `staging/{episode}/sessions/{launch}/{session}` | a relaunched session's alias: agent and last replayed call | gateway | gateway | latest |
| `staging/{episode}/opencode/{session}` | an OpenCode subagent session's name (gateway/pipeline/opencode_names.py) | gateway | gateway | once (the first write wins) |

The episode's ledger, paged when it hands over (ledger/handover.py), deleted when the episode ends:

| key | what lives there | written by | read by | how |
| --- | --- | --- | --- | --- |
| `ledger/{episode}/run-{r:05d}/{purpose}/page-{n:05d}.json` | one snapshot page of run `r` (`purpose`: handover, live, final) | episode workflow (`store_ledger_page` activity) | the next run's restore (`load_ledger_page`), materialize | once |
| `ledger/{episode}/run-{r:05d}/index.json` | a settled run's page list, linked to the previous run's index | episode workflow (`store_ledger_index` activity) | materialize (follows the chain) | once |

What a closed episode leaves (the materialize activity, activities/episode_io.py), each root of its own so
that listing `rows/{run}/` lists row files only:

| key | what lives there | written by | read by | how |
| --- | --- | --- | --- | --- |
| `rows/{episode}.parquet` | the episode's training rows | materialize | train_step, `grove episode show`, `grove episode view` | once |
| `contexts/{episode}.jsonl` | its context map (activities/episode_map.py) | materialize | `grove episode show` | once |
| `calls/{episode}.json` | its call archive (capture/call_archive.py) | materialize | `grove episode view` | once (a retry that finds another archive keeps it) |

Runs and checkpoints:

| key | what lives there | written by | read by | how |
| --- | --- | --- | --- | --- |
| `checkpoints/{run}/step-{N:06d}/model/{file}` | the weights after optimizer step N: a Hugging Face folder | train_step (trainer/checkpoint.py) | publish_weights, engines following the run (activities/follow.py), the next train_step | marker |
| `checkpoints/{run}/step-{N:06d}/{optimizer.pt, optimizer/..., trainer_state.json}` | optimizer and learner state (file names: trainer/checkpoint.py) | train_step | a resumed train_step | marker |
| `checkpoints/{run}/step-{N:06d}/COMMIT` | the step's manifest {file: sha256}, written last: the step exists | train_step | everyone above; `latest_committed_step` lists these | marker |
| `checkpoints/{run}/step-{N:06d}/metrics.json` | the step's learner metrics | train_step | a retried train_step that finds the step committed | latest |
| `checkpoints/{run}/step-{N:06d}/episodes.json` | per episode: status, baseline, advantage | train_step | people inspecting a step | latest |
| `checkpoints/{run}/step-{N:06d}/guard_refusal.json` | the gradient guard's evidence of a refused step (trainer/grad_guard.py) | train_step | the operator | latest |
| `runs/{run}/base-model/model/{file}` and `runs/{run}/base-model/COMMIT` | the run's base model, policy version 0 (trainer/base_model.py) | `stage_base_model` | engines, the learner of step 1 | marker |
| `runs/{run}/steps/step-{N:06d}.json` | a step record the run's state no longer carries | `archive_step_records` activity | `grove run show` (cli/runs.py) | once |

Engines:

| key | what lives there | written by | read by | how |
| --- | --- | --- | --- | --- |
| `engines/{queue}/{engine}.json` | an inference engine's status, every second (activities/engine_status.py) | the engine's worker | `engine_statuses` activity, benchmarks | latest |

A checkpoint step's COMMIT lists only its checkpoint files: `metrics.json`, `episodes.json` and
`guard_refusal.json` sit beside them and are written before it. The base model lives under `runs/`, not
`checkpoints/{run}/`, whose COMMIT markers are the optimizer steps only.
"""

from __future__ import annotations

STAGING_ROOT = "staging"
LEDGER_ROOT = "ledger"
ROWS_ROOT = "rows"
CONTEXTS_ROOT = "contexts"
CALLS_ROOT = "calls"
CHECKPOINTS_ROOT = "checkpoints"
RUNS_ROOT = "runs"
ENGINES_ROOT = "engines"
ROOTS = (
    STAGING_ROOT,
    LEDGER_ROOT,
    ROWS_ROOT,
    CONTEXTS_ROOT,
    CALLS_ROOT,
    CHECKPOINTS_ROOT,
    RUNS_ROOT,
    ENGINES_ROOT,
)

COMMIT = "COMMIT"  # the marker written last under a checkpoint's or a base model's prefix
MODEL_DIR = "model"  # the Hugging Face folder under a checkpoint's or a base model's prefix


# ---- staging: one folder per episode, deleted when it ends --------------------------------------


def staging_prefix(episode_id: str) -> str:
    return f"{STAGING_ROOT}/{episode_id}/"


def staging_key(episode_id: str, call_id: str) -> str:
    """A call's staged token arrays."""
    return f"{staging_prefix(episode_id)}{call_id}.safetensors"


def staged_receipt_key(episode_id: str, call_id: str, arrays_sha256: str) -> str:
    """What a call's staged arrays were sampled with; the full sha256 of the arrays' object."""
    return f"{staging_prefix(episode_id)}{call_id}.receipt-{arrays_sha256}.json"


def chat_record_key(episode_id: str, call_id: str) -> str:
    """The gateway's chat record of a call, beside its `.safetensors`."""
    return f"{staging_prefix(episode_id)}{call_id}.chat.json"


def chat_prompt_key(episode_id: str, call_id: str, sha256: str) -> str:
    """A claim-checked chat prompt (its bytes' sha256)."""
    return f"{staging_prefix(episode_id)}requests/{call_id}-{sha256[:16]}.json"


def conversation_prefix(episode_id: str, call_id: str) -> str:
    """Where call `call_id`'s stored conversations are: a continuation may name only its parent's."""
    return f"{staging_prefix(episode_id)}conversations/{call_id}-"


def conversation_key(episode_id: str, call_id: str, sha256: str) -> str:
    return f"{conversation_prefix(episode_id, call_id)}{sha256[:16]}.json"


def completion_key(episode_id: str, call_id: str, sha256: str) -> str:
    """A claim-checked completion (its bytes' sha256)."""
    return f"{staging_prefix(episode_id)}completions/{call_id}-{sha256[:16]}.json"


def prompt_index_prefix(episode_id: str, digest: str) -> str:
    """The calls recorded with prompt `digest` (relaunch replay's index): one empty object per call."""
    return f"{staging_prefix(episode_id)}prompts/{digest}/"


def prompt_index_key(episode_id: str, digest: str, call_id: str) -> str:
    return f"{prompt_index_prefix(episode_id, digest)}{call_id}"


def session_aliases_prefix(episode_id: str, launch: int) -> str:
    """The aliases of launch `launch`'s sessions."""
    return f"{staging_prefix(episode_id)}sessions/{launch}/"


def session_alias_key(episode_id: str, launch: int, session_id: str) -> str:
    return f"{session_aliases_prefix(episode_id, launch)}{session_id}"


def opencode_names_prefix(episode_id: str) -> str:
    """The names of the episode's OpenCode subagent sessions."""
    return f"{staging_prefix(episode_id)}opencode/"


def opencode_name_key(episode_id: str, session_id: str) -> str:
    return f"{opencode_names_prefix(episode_id)}{session_id}"


# ---- the episode's ledger pages ------------------------------------------------------------------


def ledger_prefix(episode_id: str) -> str:
    return f"{LEDGER_ROOT}/{episode_id}/"


def ledger_page_key(episode_id: str, run_index: int, purpose: str, index: int) -> str:
    """Page `index` of workflow run `run_index`'s snapshot for `purpose` (handover, live, final)."""
    return f"{ledger_prefix(episode_id)}run-{run_index:05d}/{purpose}/page-{index:05d}.json"


def ledger_index_key(episode_id: str, run_index: int) -> str:
    """A settled run's list of pages, one link of the chain materialize follows."""
    return f"{ledger_prefix(episode_id)}run-{run_index:05d}/index.json"


# ---- what a closed episode leaves ----------------------------------------------------------------


def rows_key(episode_id: str) -> str:
    """An episode's rows: `rows/{run}/s{step}/t{task}/g{j}.parquet` for a run's episode."""
    return f"{ROWS_ROOT}/{episode_id}.parquet"


def contexts_key(episode_id: str) -> str:
    """A closed episode's context map, one JSON line per context."""
    return f"{CONTEXTS_ROOT}/{episode_id}.jsonl"


def call_archive_key(episode_id: str) -> str:
    """A closed episode's call archive, for viewers."""
    return f"{CALLS_ROOT}/{episode_id}.json"


# ---- checkpoints: one folder per optimizer step, visible with its COMMIT ------------------------


def checkpoints_prefix(run_id: str) -> str:
    """Every checkpoint of a run (listing it finds the steps' COMMIT markers)."""
    return f"{CHECKPOINTS_ROOT}/{run_id}/"


def checkpoint_prefix(run_id: str, step: int) -> str:
    """The checkpoint of optimizer step `step` (policy version `step`)."""
    return f"{checkpoints_prefix(run_id)}step-{step:06d}/"


def commit_key(run_id: str, step: int) -> str:
    """The marker that makes step `step`'s checkpoint exist: its manifest {file: sha256}."""
    return checkpoint_prefix(run_id, step) + COMMIT


def model_file_key(run_id: str, step: int, filename: str) -> str:
    return checkpoint_prefix(run_id, step) + f"{MODEL_DIR}/{filename}"


def metrics_key(run_id: str, step: int) -> str:
    return checkpoint_prefix(run_id, step) + "metrics.json"


def episodes_key(run_id: str, step: int) -> str:
    """Per episode of the step: status, failure kind, baseline reward, advantage (for inspection)."""
    return checkpoint_prefix(run_id, step) + "episodes.json"


def guard_refusal_key(run_id: str, step: int) -> str:
    """The gradient guard's evidence of a refused step: which pass, rows, norms."""
    return checkpoint_prefix(run_id, step) + "guard_refusal.json"


def parse_step(key: str) -> int | None:
    """The step number of a `.../step-NNNNNN/COMMIT` key, else None."""
    parts = key.rstrip("/").split("/")
    if len(parts) < 2 or parts[-1] != COMMIT or not parts[-2].startswith("step-"):
        return None
    digits = parts[-2][len("step-") :]
    return int(digits) if digits.isdigit() else None


# ---- runs: the base model and archived step records ----------------------------------------------


def base_model_prefix(run_id: str) -> str:
    """A run's base model (policy version 0), beside its step records."""
    return f"{RUNS_ROOT}/{run_id}/base-model/"


def base_model_commit_key(run_id: str) -> str:
    return base_model_prefix(run_id) + COMMIT


def step_records_prefix(run_id: str) -> str:
    """The step records a run's state no longer carries."""
    return f"{RUNS_ROOT}/{run_id}/steps/"


def step_record_key(run_id: str, step: int) -> str:
    return f"{step_records_prefix(run_id)}step-{step:06d}.json"


# ---- engines -------------------------------------------------------------------------------------


def engine_statuses_prefix(queue: str) -> str:
    """The status reports of the engines serving `queue`."""
    return f"{ENGINES_ROOT}/{queue}/"


def engine_status_key(queue: str, engine_id: str) -> str:
    return f"{engine_statuses_prefix(queue)}{engine_id}.json"
