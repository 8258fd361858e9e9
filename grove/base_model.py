"""The `stage_base_model` activity's input and result: the run's base model (policy version 0) written to
the object store once, by the trainer host, when the run starts (trainer/base_model.py says why)."""

from __future__ import annotations

from pydantic import BaseModel


class StageBaseModelInput(BaseModel):
    run_id: str
    model: str  # RunConfig.model: a name or a folder, resolved on the trainer host


class StageBaseModelResult(BaseModel):
    files: int  # in the committed manifest
    written: bool  # False: the base was committed already (a retry, a resumed run)
