"""Gateway settings: validated, built lazily (`GatewaySettings.from_env()` at startup, never at import)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from gateway.intake.large_bodies import BodyAdmissionLimits
from gateway.intake.limits import RequestLimits
from gateway.intake.tokenization import TokenizationLimits
from gateway.temporal.worker_wait import WORKER_PATIENCE_S
from grove.client import DEFAULT_ADDRESS
from storage.config import default_store_url

SECRET_VAR = "GROVE_GATEWAY_SECRET"
MIN_SECRET_LEN = 16
# = activities.engine_config.EngineConfig's max_model_len default (a unit test keeps them equal): the context
# `grove worker` engines serve unless told otherwise.
DEFAULT_MAX_MODEL_LEN = 2048


class GatewaySettingsError(ValueError):
    """Settings the gateway cannot start with (missing or weak secret, bad value)."""


class GatewaySettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    temporal_address: str = DEFAULT_ADDRESS
    namespace: str = "default"
    store: str = Field(description="object-store URL or path (storage/config.py), as GROVE_STORE")
    secret: SecretStr = Field(description="HMAC key of the per-episode bearer tokens")
    model_name: str = "grove"  # the model id clients send and /v1/models lists
    host: str = "127.0.0.1"
    port: int = Field(8400, ge=0, le=65535)
    # The model the run's engines serve (a registry name or a folder, as `grove worker --model`) and
    # their context (`max_model_len`): the gateway renders each prompt with that model's tokenizer and
    # refuses one that does not fit (400 context_length_exceeded) before anything is admitted.
    policy_model: str = "tiny"
    max_model_len: int = Field(DEFAULT_MAX_MODEL_LEN, ge=16)
    limits: RequestLimits = Field(default_factory=RequestLimits)
    # how long a request waits for a grove worker to poll its episode's queue
    # (gateway/temporal/worker_wait.py)
    worker_wait_s: float = Field(WORKER_PATIENCE_S, ge=0)
    tokenization: TokenizationLimits = Field(default_factory=TokenizationLimits)
    bodies: BodyAdmissionLimits = Field(default_factory=BodyAdmissionLimits)

    @field_validator("secret")
    @classmethod
    def _strong_secret(cls, secret: SecretStr) -> SecretStr:
        if len(secret.get_secret_value()) < MIN_SECRET_LEN:
            raise ValueError(
                f"the gateway secret has fewer than {MIN_SECRET_LEN} characters; set {SECRET_VAR} to a long "
                "random string (e.g. `openssl rand -hex 32`)"
            )
        return secret

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> GatewaySettings:
        """Settings from GROVE_TEMPORAL_ADDRESS, GROVE_TEMPORAL_NAMESPACE, GROVE_STORE,
        GROVE_GATEWAY_SECRET, GROVE_GATEWAY_MODEL, GROVE_GATEWAY_POLICY_MODEL,
        GROVE_GATEWAY_MAX_MODEL_LEN, GROVE_GATEWAY_MAX_BODY_BYTES, GROVE_GATEWAY_WORKER_WAIT_S,
        GROVE_GATEWAY_TOKENIZER_PROCESSES, plus
        explicit overrides."""
        env = os.environ if environ is None else environ
        if SECRET_VAR not in env and "secret" not in overrides:
            raise GatewaySettingsError(
                f"{SECRET_VAR} is not set; the gateway signs per-episode tokens with it. Set it to a long "
                "random string and give harnesses tokens from gateway.http.auth.issue_token"
            )
        values: dict[str, object] = {
            "temporal_address": env.get("GROVE_TEMPORAL_ADDRESS", DEFAULT_ADDRESS),
            "namespace": env.get("GROVE_TEMPORAL_NAMESPACE", "default"),
            "store": env.get("GROVE_STORE") or default_store_url(),
            "secret": env.get(SECRET_VAR),
            "model_name": env.get("GROVE_GATEWAY_MODEL", "grove"),
            "policy_model": env.get("GROVE_GATEWAY_POLICY_MODEL", "tiny"),
            "max_model_len": env.get("GROVE_GATEWAY_MAX_MODEL_LEN", DEFAULT_MAX_MODEL_LEN),
        }
        if "GROVE_GATEWAY_WORKER_WAIT_S" in env:
            values["worker_wait_s"] = env["GROVE_GATEWAY_WORKER_WAIT_S"]
        if "GROVE_GATEWAY_MAX_BODY_BYTES" in env:
            values["limits"] = {"max_body_bytes": env["GROVE_GATEWAY_MAX_BODY_BYTES"]}
        if "GROVE_GATEWAY_TOKENIZER_PROCESSES" in env:
            values["tokenization"] = {"processes": env["GROVE_GATEWAY_TOKENIZER_PROCESSES"]}
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(values)
        except ValidationError as err:
            raise GatewaySettingsError(f"invalid gateway settings: {err}") from None
