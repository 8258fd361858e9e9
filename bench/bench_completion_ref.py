"""What a claim-checked completion costs against an inline one
(grove/contracts/generation.py COMPLETION_INLINE_MAX).

For completions of N tokens of English prose under a model's tokenizer: the bytes the completion adds
to a payload inline (ids + text + chat message, `capture/claims.py inline_size`), the bytes of the
reference that replaces it, and the time of the reference's round trip (the generate activity's
`stash_completion` + the gateway's `load_completion`) on a real LocalStore (fsync'd writes). Inline
bytes land twice in the history (the activity result and the `call` Update's result).

    python bench/bench_completion_ref.py [--model-dir DIR] [--store DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capture.claims import inline_size, load_completion, stash_completion  # noqa: E402
from grove.contracts import Completion  # noqa: E402
from storage.local import LocalStore  # noqa: E402

PROSE = (
    "The workers read the files they were given, wrote down what each function does, and sent their "
    "notes back to the lead, who compared them, asked one worker to look again at the parser, and then "
    "wrote a short plan: fix the off-by-one in the tokenizer loop, add a test for empty input, and run "
    "the suite before sending the patch. "
)


def sample(tokenizer, n: int) -> tuple[list[int], str]:
    ids = tokenizer(PROSE * (1 + n // 40), add_special_tokens=False)["input_ids"][:n]
    return ids, tokenizer.decode(ids)


def main() -> None:
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = sorted((Path.home() / ".cache/grove/models").glob("smollm2-*"))
    parser.add_argument("--model-dir", type=Path, default=default[0] if default else None)
    parser.add_argument("--store", type=Path, default=None, help="store folder (default: a temp dir)")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    tok = AutoTokenizer.from_pretrained(str(args.model_dir))
    root = args.store or Path(tempfile.mkdtemp(prefix="bench-completion-"))
    store = LocalStore(root)
    print(f"tokenizer {args.model_dir.name}, store {root}")
    print("tokens  inline B  ref B  ref round trip ms (median, p90)")
    for n in (16, 64, 256, 512, 1024, 4096, 16384):
        ids, text = sample(tok, n)
        completion = Completion(text=text, assistant_message={"role": "assistant", "content": text})
        times = []
        for i in range(args.repeats):
            t0 = time.perf_counter()
            ref = stash_completion(store, "bench/s000001/t0/g0", f"c{n}-{i}", completion)
            load_completion(store, "bench/s000001/t0/g0", ref)
            times.append((time.perf_counter() - t0) * 1e3)
        times.sort()
        p90 = times[int(0.9 * (len(times) - 1))]
        ref_bytes = len(ref.model_dump_json())
        inline = inline_size(ids, completion)
        print(f"{len(ids):6d}  {inline:8d}  {ref_bytes:5d}  {statistics.median(times):6.2f}, {p90:6.2f}")


if __name__ == "__main__":
    main()
