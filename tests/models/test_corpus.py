"""The synthetic corpus's instruction drills, and the copying they give the pretrained tiny model."""

from __future__ import annotations

import re

import torch

from models.corpus import generate_copy_drills, generate_corpus

DRILL = re.compile(
    r"^(?:<\|im_start\|>system\n[^<]*<\|im_end\|>\n)?"
    r"<\|im_start\|>user\nWord:\n(?P<asked>[a-z]+)<\|im_end\|>\n"
    r"<\|im_start\|>assistant\n(?P<answer>[a-z]+)<\|im_end\|>\n$"
)


def test_copy_drills_repeat_the_word_they_are_given():
    docs = generate_copy_drills(0, n_documents=300)
    assert docs == generate_copy_drills(0, n_documents=300)  # a pure function of its arguments
    assert docs != generate_copy_drills(1, n_documents=300)
    for doc in docs:
        m = DRILL.match(doc)
        assert m, doc
        assert m["answer"] == m["asked"]
    assert len({DRILL.match(d)["asked"] for d in docs}) > 60  # common words and rare names, not one word


def test_a_quarter_of_the_corpus_is_drills_and_the_rest_is_kept():
    docs = generate_corpus(0, n_documents=4000)
    echo = sum("<|im_start|>user\nWord:\n" in d or "Repeat" in d or "Say " in d for d in docs)
    report = sum("<|im_start|>tool\n" in d and "# Tools" not in d for d in docs)
    # _DRILL_SHARE = 0.25, echo:report = 2:1 -> ~667 and ~333 of 4000; the bounds allow sampling noise
    # and the few echo asks without a marker ("{w}" alone).
    assert 450 < echo < 760, echo
    assert 270 < report < 400, report
    assert sum("get_weather" in d for d in docs) > 200  # the tool-call chats are still there


def test_pretrained_tiny_model_sometimes_repeats_a_given_word(tiny_trained_model_dir):
    """The copy drills leave the pretrained model able to repeat a prompted word well above chance,
    but far from always (the delegation demo's RL sharpens it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_trained_model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_trained_model_dir)).eval()
    words = ["red", "blue", "green", "cat", "dog", "sun", "moon", "tree", "fish", "bird", "star", "book"]
    first = {w: tok.encode(w, add_special_tokens=False)[0] for w in words}
    right, wrong = [], []
    for w in words:
        messages = [
            {"role": "system", "content": "You are a worker. Answer with the word you are given."},
            {"role": "user", "content": f"Word:\n{w}"},
        ]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt = torch.tensor([tok.encode(ids, add_special_tokens=False)])
        with torch.no_grad():
            probs = torch.softmax(model(input_ids=prompt).logits[0, -1], -1)
        right.append(float(probs[first[w]]))
        wrong.extend(float(probs[first[o]]) for o in words if o != w)
    p_right, p_wrong = sum(right) / len(right), sum(wrong) / len(wrong)
    # p_wrong is chance among these words; figures: docs/results.md section 4.
    assert p_right > 0.05, (p_right, p_wrong)
    assert p_right > 5 * p_wrong, (p_right, p_wrong)
    assert p_right < 0.9, "the base model should not already be perfect at it"
