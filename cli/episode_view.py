"""`grove episode view ID` and `grove run view RUN`: offline HTML pages of an episode and of a run.

    grove episode view adhoc/3f2a9c --out episode.html [--model tiny]
    grove run view delegation-pw --out runs/delegation-pw/view [--episodes-of 5]

Each page is one self-contained file (its script and style inline, no network) with the data embedded
as JSON. The episode page shows the agent tree, every call (state, version, sampling, timing, prompt
tail, completion tokens marked trained / conditioning / untrained with behaviour log-probabilities),
the rows, reward components and advantages (cli/episode_view_data.py says where each comes from). The
run page shows reward curves per role, the step table and each step's episodes, linking to their pages,
which it writes beside itself for the steps asked (`--episodes-of`, default the last step).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from capture.call_archive import load_archive
from cli.episode_view_data import TokenText, assemble_view, generate_timing, ids_as_text, tokenizer_pieces
from cli.runs import _recorded_config, run_progress, step_episodes, step_history, ui_url
from grove.client import workflow_runs
from grove.contracts import EpisodeResult, RunConfig
from storage.base import ObjectNotFoundError, ObjectStore
from trainer.advantages import group_advantages
from trainer.rows import rows_from_parquet

_GROUP_MEMBER = re.compile(r"^(?P<group>(?P<run>.+)/s(?P<step>\d+)/t[^/]+)/g\d+$")


class EpisodeNotFoundError(LookupError):
    """No workflow with this episode id on the server."""


def page_name(episode_id: str) -> str:
    """A file name for an episode's page (ids hold '/')."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", episode_id) + ".html"


def token_text(model: str | None) -> TokenText:
    """Decoded pieces with `model`'s tokenizer when it is built (a viewer never builds a model), else ids."""
    if not model:
        return ids_as_text
    try:
        from transformers import AutoTokenizer

        from models.registry import ensure_model, uncached_builds

        if uncached_builds(model):
            return ids_as_text
        return tokenizer_pieces(AutoTokenizer.from_pretrained(str(ensure_model(model))))
    except Exception:  # a page without token text beats no page: any tokenizer failure shows ids
        return ids_as_text


async def _describe(client: Client, episode_id: str):
    try:
        return await client.get_workflow_handle(episode_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise EpisodeNotFoundError(
                f"no episode {episode_id!r} on {client.service_client.config.target_host}; "
                "`grove run episodes RUN --step N` lists a run's episodes"
            ) from None
        raise


def _learner_settings(config: RunConfig | None) -> tuple[bool, float, float]:
    if config is None:
        from grove.learner_config import LearnerConfig

        learner = LearnerConfig()
    else:
        learner = config.learner
    return learner.adv_std_scaling, learner.adv_eps, learner.failure_reward


async def run_config_of(client: Client, run_id: str) -> RunConfig | None:
    """The run's recorded config (its workflow's memo), None for an episode outside any run."""
    try:
        return await _recorded_config(await client.get_workflow_handle(run_id).describe())
    except RPCError:
        return None


async def group_advantage(
    client: Client, result: EpisodeResult, siblings: Sequence[str], config: RunConfig | None
) -> dict[str, Any]:
    """The advantage GRPO gives this episode among its group's closed episodes (trainer/advantages.py
    `group_advantages`, the run's learner settings)."""
    std_scaling, eps, failure_reward = _learner_settings(config)
    results = [result]
    for eid in siblings:
        if eid != result.episode_id:
            sib = await _result(client, eid)
            if sib is not None and sib.group_id == result.group_id:
                results.append(sib)
    results.sort(key=lambda r: r.episode_id)
    rewards, valid = [], []
    for r in results:
        rec = r.record()
        in_baseline = rec.status == "ok" or rec.failure_kind == "policy"
        rewards.append(r.reward if rec.status == "ok" else failure_reward)
        valid.append(in_baseline)
    values = group_advantages(np.asarray(rewards), np.asarray(valid), std_scaling=std_scaling, eps=eps)
    mine = next(i for i, r in enumerate(results) if r.episode_id == result.episode_id)
    return {
        "value": float(values[mine]) if result.status == "ok" else 0.0,
        "group": [
            {"episode": r.episode_id, "reward": r.reward, "status": r.status, "advantage": float(v)}
            for r, v in zip(results, values, strict=True)
        ],
        "std_scaling": std_scaling,
        "note": "a group of fewer than two baseline episodes gives 0" if sum(valid) < 2 else "",
    }


async def _result(client: Client, episode_id: str) -> EpisodeResult | None:
    handle = client.get_workflow_handle(episode_id, result_type=EpisodeResult)
    try:
        desc = await handle.describe()
        if desc.status != WorkflowExecutionStatus.COMPLETED:
            return None
        return await handle.result()
    except RPCError:
        return None


async def _siblings(client: Client, episode_id: str) -> list[str]:
    """The other episodes of a run's group (`{run}/s{step}/t{task}/g{j}`, listed by id prefix, which holds
    for episodes started by hand too); none for other ids."""
    match = _GROUP_MEMBER.match(episode_id)
    if match is None or set("'\\").intersection(episode_id):
        return []
    group = match.group("group")
    query = f"WorkflowType = 'EpisodeWorkflow' AND WorkflowId STARTS_WITH '{group}/g'"
    try:
        ids = {wf.id async for wf in client.list_workflows(query)}
    except RPCError:
        return []
    return sorted(i for i in ids if (m := _GROUP_MEMBER.match(i)) and m.group("group") == group)


async def gather_view(client: Client, store: ObjectStore, episode_id: str, text: TokenText) -> dict[str, Any]:
    """The episode page's data (cli/episode_view_data.py `assemble_view`)."""
    desc = await _describe(client, episode_id)
    status = desc.status.name if desc.status else "UNKNOWN"
    result = await _result(client, episode_id) if desc.status == WorkflowExecutionStatus.COMPLETED else None
    rows = []
    if result is not None and result.num_rows:
        try:
            rows = rows_from_parquet(store.get(result.rows_key))
        except ObjectNotFoundError:
            rows = []
    advantage = None
    if result is not None:
        member = _GROUP_MEMBER.match(episode_id)
        config = await run_config_of(client, member.group("run")) if member else None
        advantage = await group_advantage(client, result, await _siblings(client, episode_id), config)
    return assemble_view(
        episode_id=episode_id,
        workflow_status=status,
        ui_url=ui_url(episode_id, client),
        archive=load_archive(store, episode_id),
        rows=rows,
        result=result,
        timing=generate_timing(await workflow_runs(client, episode_id)),
        advantage=advantage,
        text=text,
    )


async def gather_run(client: Client, store: ObjectStore, run_id: str) -> dict[str, Any]:
    """The run page's data: config, step records, each step's episodes."""
    desc, state, result = await run_progress(client, run_id)
    if result is not None:
        history = step_history(store, run_id, result.history, result.history_from)
    elif state is not None:
        history = step_history(store, run_id, state.history, state.history_from)
    else:
        history = []
    config = state.config if state else await _recorded_config(desc)
    steps = []
    for record in history:
        episodes = await step_episodes(client, run_id, record.step, missing_ok=True)
        for e in episodes:
            e["page"] = page_name(e["episode_id"])
        steps.append(record.model_dump(mode="json") | {"episode_list": episodes})
    return {
        "run_id": run_id,
        "workflow_status": desc.status.name if desc.status else "UNKNOWN",
        "model": config.model if config else None,
        "train_agents": config.train_agents if config else None,
        "ui": ui_url(run_id, client),
        "steps": steps,
    }


# ------------------------------------------------------------------------------------------ writing


async def write_episode_page(
    client: Client, store: ObjectStore, episode_id: str, out: Path, model: str | None
) -> dict[str, Any]:
    """Write the episode's page to `out`; returns its data. `model` None: the run's model, else tiny."""
    from cli.view_html import episode_html

    if model is None:
        member = _GROUP_MEMBER.match(episode_id)
        config = await run_config_of(client, member.group("run")) if member else None
        model = config.model if config else "tiny"
    view = await gather_view(client, store, episode_id, token_text(model))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(episode_html(view), encoding="utf-8")
    return view


async def write_run_pages(
    client: Client, store: ObjectStore, run_id: str, out_dir: Path, episodes_of: Sequence[int] | None
) -> tuple[Path, list[Path]]:
    """Write the run's page (`out_dir/index.html`) and the pages of the episodes of `episodes_of` (default:
    the last recorded step) under `out_dir/episodes/`; returns their paths."""
    from cli.view_html import episode_html, run_html

    run = await gather_run(client, store, run_id)
    wanted = set(episodes_of) if episodes_of else {run["steps"][-1]["step"]} if run["steps"] else set()
    text = token_text(run.get("model") or "tiny")
    written = []
    for step in run["steps"]:
        for e in step["episode_list"]:
            e["written"] = step["step"] in wanted and e["workflow_status"] == "COMPLETED"
            if e["written"]:
                path = out_dir / "episodes" / e["page"]
                path.parent.mkdir(parents=True, exist_ok=True)
                view = await gather_view(client, store, e["episode_id"], text)
                path.write_text(episode_html(view), encoding="utf-8")
                written.append(path)
    index = out_dir / "index.html"
    out_dir.mkdir(parents=True, exist_ok=True)
    index.write_text(run_html(run), encoding="utf-8")
    return index, written
