"""Held-out evaluation of a run's policy: which tasks, which episodes, and the record of their scores.

Pure (imported inside the run workflow's sandbox). Every `eval_every` steps, after the step's update is
published, the run starts one ordinary EpisodeWorkflow per held-out task (durable, visible in the UI,
ids `{run}/eval/s{step:06d}/t{task}/g0`) sampled with `eval_sampling`, and records their scores in that
step's StepRecord.eval; their rows are never given to the learner. The evaluation is part of the step:
the step is recorded only after it, so a resumed run (which starts after its last recorded step) never
runs a finished evaluation again, and a cancel lets it finish like the rest of the step.

An evaluation of step N scores exactly policy version N: its calls carry PolicyRef(min_version =
max_version = N), so an engine serves them with version N or refuses them (activities/follow.py
`PolicyVersionPassedError`: engines never move back), never with a version an overlapped run
(max_policy_lag > 0) committed since. EvalRecord.served_versions lists the versions that served it.

Held-out tasks are the family's indices num_tasks .. num_tasks + eval_tasks - 1: a fixed set, in index
order, disjoint by index from the training tasks (0 .. num_tasks - 1). A family whose tasks repeat (the
same parameters under another index) could still hand the learner a held-out task under a training
index; `eval_specs` refuses such a configuration (HeldOutOverlapError) instead of reporting a
contaminated score.
"""

from __future__ import annotations

from grove.contracts import EpisodeResult, EpisodeSpec, EvalRecord, PolicyRef, RunConfig
from harnesses.programs import family


class HeldOutOverlapError(ValueError):
    """A held-out task equals a training task of the run (the family repeats tasks)."""


def eval_task_indices(cfg: RunConfig) -> list[int]:
    return list(range(cfg.num_tasks, cfg.num_tasks + cfg.eval_tasks))


def eval_group_id(run_id: str, step: int, task: int) -> str:
    return f"{run_id}/eval/s{step:06d}/t{task}"


def evaluates_at(cfg: RunConfig, step: int) -> bool:
    return cfg.eval_every > 0 and step % cfg.eval_every == 0


def eval_specs(cfg: RunConfig, step: int) -> list[EpisodeSpec]:
    """One episode per held-out task, in index order. Raises HeldOutOverlapError (see module doc)."""
    make_task, _ = family(cfg.task_family)
    training = {_key(make_task(i).params) for i in range(cfg.num_tasks)}
    specs = []
    for t in eval_task_indices(cfg):
        task = make_task(t)
        if _key(task.params) in training:
            raise HeldOutOverlapError(
                f"held-out task {task.task_id} of family {cfg.task_family!r} repeats a training task "
                f"(params {task.params}); lower num_tasks + eval_tasks to the family's distinct tasks"
            )
        group = eval_group_id(cfg.run_id, step, t)
        specs.append(
            EpisodeSpec(
                run_id=cfg.run_id,
                step=step,
                group_id=group,
                episode_id=f"{group}/g0",
                task=task,
                harness=cfg.harness,
                sampling=cfg.eval_sampling or cfg.sampling,
                train_agents=cfg.train_agents,
                inference_queue=cfg.inference_queue,
                # exactly the policy this evaluation is of: an engine never serves it a newer one, even
                # when the run has committed one since (activities/follow.py)
                policy=PolicyRef(run_id=cfg.run_id, min_version=step, max_version=step, base_model=cfg.model),
            )  # fmt: skip
        )
    return specs


def eval_record(version: int, results: list[EpisodeResult | None]) -> EvalRecord:
    """Scores of one evaluation; None stands for an episode that ended without a result."""
    ok = [r for r in results if r is not None and r.status == "ok"]
    names = sorted({k for r in ok for k in r.reward_details})
    return EvalRecord(
        policy_version=version,
        served_versions=sorted({v for r in results if r is not None for v in r.policy_versions}),
        mean_reward=sum(r.reward for r in ok) / len(ok) if ok else 0.0,
        episodes=len(results),
        failed_episodes=len(results) - len(ok),
        reward_components={
            k: sum(v) / len(v)
            for k in names
            if (v := [r.reward_details[k] for r in ok if k in r.reward_details])
        },
    )


def _key(params: dict) -> str:
    return repr(sorted(params.items()))
