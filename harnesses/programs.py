"""Registry of native programs (by name, as EpisodeSpec.harness.program) and task families."""

from __future__ import annotations

from collections.abc import Callable

from grove.contracts import HarnessOutcome, RewardResult, TaskSpec
from harnesses import (
    claude_code_delegation,
    delegation,
    framework_delegation,
    opencode_delegation,
    opencode_reader,
    opencode_report,
    scenario,
    summary_delegation,
)
from harnesses.native import Program

PROGRAMS: dict[str, Program] = {
    delegation.FAMILY: delegation.program,
    summary_delegation.FAMILY: summary_delegation.program,
    scenario.NAME: scenario.program,
    scenario.SINGLE_NAME: scenario.single_agent_program,
    scenario.OUTCOMES_NAME: scenario.group_outcomes_program,
    scenario.LONG_NAME: scenario.long_conversation_program,
}


class UnknownTaskFamilyError(KeyError):
    """A task family grove does not know."""


TASK_FAMILIES: dict[
    str, tuple[Callable[[int], TaskSpec], Callable[[TaskSpec, HarnessOutcome], RewardResult]]
] = {
    delegation.FAMILY: (delegation.make_task, delegation.score),
    scenario.NAME: (scenario.make_task, scenario.score),
    # delegation whose workers answer from their own summaries (harnesses/summary_delegation.py)
    summary_delegation.FAMILY: (summary_delegation.make_task, summary_delegation.score),
    # driven by stock OpenCode through the gateway (harnesses/opencode_delegation.py)
    opencode_delegation.FAMILY: (opencode_delegation.make_task, opencode_delegation.score),
    # the same with workers that read a file and compact mid-way (harnesses/opencode_reader.py)
    opencode_reader.FAMILY: (opencode_reader.make_task, opencode_reader.score),
    # the same episodes, rewarded for the shape of the reports and the final answer
    # (harnesses/opencode_report.py)
    opencode_report.FAMILY: (opencode_report.make_task, opencode_report.score),
    # driven by stock Claude Code through the gateway's Messages API (harnesses/claude_code_delegation.py)
    claude_code_delegation.FAMILY: (claude_code_delegation.make_task, claude_code_delegation.score),
    # driven by a LangGraph or Agents SDK program the runner launches (harnesses/framework_delegation.py)
    **{
        name: (framework_delegation.make_task_of(name), framework_delegation.score)
        for name in framework_delegation.ENTRIES
    },
}


def family(name: str):
    try:
        return TASK_FAMILIES[name]
    except KeyError:
        raise UnknownTaskFamilyError(
            f"unknown task family {name!r}; known: {sorted(TASK_FAMILIES)}"
        ) from None
