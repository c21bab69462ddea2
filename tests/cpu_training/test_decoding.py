"""sglang's request semantics in the transformers decoder (spader.agent.decoding), with the real
tiny random Qwen3 and its tokenizer: budgets, end-of-sequence and stop tokens, stop strings and
regexes (the matched token kept in the ids, the text trimmed unless no_stop_trim), per-request
seeds independent of batching, and log-probs of the processed distribution."""

from __future__ import annotations

import pytest
import torch

from spader.agent.decoding import DecodeParams, decode_batch, finish_point, parse_sampling_params


@pytest.fixture(scope="module")
def lm(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    return model, tok


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_sampling_params_follow_sglang_names_and_refuse_what_they_would_ignore():
    p = parse_sampling_params(
        {"max_tokens": 7, "temperature": 0.5, "top_k": -1, "seed": 3, "stop": "</answer>", "logprobs": True},
        default_max_new_tokens=99,
    )
    assert (p.max_new_tokens, p.temperature, p.top_k, p.seed, p.stop, p.logprobs) == (
        7, 0.5, -1, 3, ("</answer>",), True,
    )  # fmt: skip
    # max_new_tokens wins over max_tokens; the default applies only when neither is given
    assert (
        parse_sampling_params({"max_new_tokens": 5, "max_tokens": 9}, default_max_new_tokens=1).max_new_tokens
        == 5
    )
    assert parse_sampling_params({}, default_max_new_tokens=11).max_new_tokens == 11
    assert parse_sampling_params({"sampling_seed": 4, "seed": 8}, default_max_new_tokens=1).seed == 4
    # neutral values of features this decoder lacks are accepted, others named in the error
    parse_sampling_params({"n": 1, "frequency_penalty": 0.0, "logit_bias": None}, default_max_new_tokens=1)
    with pytest.raises(ValueError, match=r"\['frequency_penalty', 'n'\]"):
        parse_sampling_params({"n": 2, "frequency_penalty": 0.5}, default_max_new_tokens=1)
    with pytest.raises(ValueError, match="beam_width"):
        parse_sampling_params({"beam_width": 4}, default_max_new_tokens=1)
    with pytest.raises(ValueError, match="top_p"):
        parse_sampling_params({"top_p": 0.0}, default_max_new_tokens=1)


def test_finish_point_checks_budget_then_tokens_then_strings(lm):
    _, tok = lm
    eos = tok.eos_token_id
    ids = _ids(tok, '<think> a </think><answer>["x"]</answer> tail')
    close = ids.index(tok.convert_tokens_to_ids("</answer>"))
    # the stop string is completed by the </answer> token, which is kept
    assert finish_point(ids, DecodeParams(max_new_tokens=50, stop=("</answer>",)), tok, [eos]) == (
        close + 1, "stop", "</answer>",
    )  # fmt: skip
    # a regex stop ends at the first token where the tail matches
    n, finish, matched = finish_point(ids, DecodeParams(max_new_tokens=50, stop_regex=(r"\[.x",)), tok, [eos])
    assert finish == "stop" and matched == r"\[.x" and n <= close
    # a stop token (here the same tag, by id) ends the turn, the token kept
    tag = tok.convert_tokens_to_ids("</think>")
    assert finish_point(ids, DecodeParams(max_new_tokens=50, stop_token_ids=(tag,)), tok, [eos]) == (
        ids.index(tag) + 1, "stop", tag,
    )  # fmt: skip
    # the budget is checked first: a stop on the last allowed token is still "length"
    assert (
        finish_point(ids, DecodeParams(max_new_tokens=close + 1, stop=("</answer>",)), tok, [eos])[1]
        == "length"
    )
    # end of sequence, unless ignored
    with_eos = [*ids[:3], eos, *ids[3:]]
    assert finish_point(with_eos, DecodeParams(max_new_tokens=50), tok, [eos]) == (4, "stop", eos)
    assert finish_point(with_eos, DecodeParams(max_new_tokens=50, ignore_eos=True), tok, [eos])[1] == "length"


def test_greedy_generation_stops_at_a_stop_string_and_trims_the_text_unless_told_not_to(lm):
    model, tok = lm
    prompt = _ids(tok, "<|im_start|>user\nQuestion: which rivers?<|im_end|>\n<|im_start|>assistant\n")
    free = decode_batch(
        model, tok, [prompt], [DecodeParams(max_new_tokens=24, temperature=0)], [tok.eos_token_id]
    )[0]
    assert free.finish == "length" and len(free.token_ids) == 24
    # pick a string the model will produce, then stop on it
    text = tok.decode(free.token_ids[:12], skip_special_tokens=False)
    stop = text[-4:]
    kept = DecodeParams(
        max_new_tokens=24, temperature=0, stop=(stop,), no_stop_trim=True, skip_special_tokens=False
    )
    trimmed = DecodeParams(max_new_tokens=24, temperature=0, stop=(stop,), skip_special_tokens=False)
    a, b = decode_batch(model, tok, [prompt, prompt], [kept, trimmed], [tok.eos_token_id])
    assert a.finish == b.finish == "stop" and a.matched == stop
    assert a.token_ids == b.token_ids == free.token_ids[: len(a.token_ids)]  # ids are never trimmed
    assert len(a.token_ids) <= 12 and stop in a.text
    assert b.text == a.text[: a.text.find(stop)]


def test_a_seeded_request_samples_the_same_tokens_alone_or_in_a_batch(lm):
    model, tok = lm
    prompts = [
        _ids(tok, f"<|im_start|>user\nQuestion {i}<|im_end|>\n<|im_start|>assistant\n") for i in range(3)
    ]
    params = [DecodeParams(max_new_tokens=16, temperature=1.0, seed=100 + i) for i in range(3)]
    batched = decode_batch(model, tok, prompts, params, [tok.eos_token_id])
    alone = [
        decode_batch(model, tok, [p], [q], [tok.eos_token_id])[0]
        for p, q in zip(prompts, params, strict=True)
    ]
    assert [r.token_ids for r in batched] == [r.token_ids for r in alone]
    other = decode_batch(
        model, tok, prompts[:1], [DecodeParams(max_new_tokens=16, temperature=1.0, seed=7)], [0]
    )
    assert other[0].token_ids != batched[0].token_ids  # the seed matters


def test_log_probs_are_those_of_the_processed_distribution(lm):
    model, tok = lm
    prompt = _ids(tok, "<|im_start|>user\nQuestion: x<|im_end|>\n<|im_start|>assistant\n")
    params = DecodeParams(max_new_tokens=8, temperature=0.7, seed=1, logprobs=True, ignore_eos=True)
    out = decode_batch(model, tok, [prompt], [params], [tok.eos_token_id])[0]
    assert len(out.log_probs) == len(out.token_ids) == 8
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out.token_ids])).logits[0]
    start = len(prompt) - 1
    expected = [
        float(torch.log_softmax(logits[start + t] / 0.7, dim=-1)[tok_id])
        for t, tok_id in enumerate(out.token_ids)
    ]
    assert out.log_probs == pytest.approx(expected, abs=1e-4)
