"""Tiny randomly initialised models, built locally (no network): a Qwen3 causal LM with a chat
template that knows the agent's special tags, and an XLM-RoBERTa cross-encoder shaped like
bge-reranker-v2-m3. Their outputs are meaningless; they exist so that the demo and the tests run
the real loading and inference code paths on a 2-core CPU machine.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from spader.models.local import TINY_MARKER, is_tiny

log = logging.getLogger(__name__)

__all__ = [
    "TINY_MARKER",
    "build",
    "build_tiny_qwen3",
    "build_tiny_reranker",
    "is_tiny",
    "save_random_cross_encoder",
]


_QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<answer>",
    "</answer>",
]

# ChatML like Qwen3's template, including tool messages wrapped in <tool_response>.
_QWEN_CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Pre-tokenization of the tiny tokenizer: a word keeps the one space that follows it, and every
# punctuation character is its own piece. The usual GPT-2 scheme glues the space to the *next*
# word, so a name reads as different tokens in running text (" Varga") and at the start of a JSON
# string ('"Varga'); with the space behind, a title in "(Title: Lake Askgarner)", the same name in
# '["Lake Askgarner"]' and the question copied into a tool call are the same token ids, which is
# what lets a model of this size learn to copy names at all.
_PIECES = r"[\p{L}\p{N}]+ ?|[^\p{L}\p{N}\s] ?|\s+"
_VOCAB = 8192  # an upper bound: merges run out at about 2,000 tokens (every word of the demo world)


def _tokenizer_texts() -> list[str]:
    """What the tiny tokenizer's merges are learned from: the agent's protocol as the chat template
    renders it (prompt, tool calls, observations, answers) on the demo world's questions and
    passages, with every generated name left out and the pieces names are built from put in
    instead (:func:`spader.demo.world.name_parts`). Whole names never become tokens: a name that
    only an evaluation question asks about is spelled with the same tokens as training names,
    whose embeddings fine-tuning has trained. Byte-level fallback keeps any text encodable."""
    import re

    from spader.core.prompt import build_user_prompt, format_observation
    from spader.demo.trajectories import answer_text, search_text
    from spader.demo.world import KINDS, build_world, name_parts

    world = build_world()
    names = {e.plain for t in world.topics for e in (t.subject, *t.objects)}
    names |= {a for t in world.topics for o in t.objects for a in o.aliases}
    pattern = re.compile("|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)))
    texts = []
    passages = [{"title": p.title, "text": p.text} for p in world.passages]
    for k in range(0, len(passages), 5):
        texts.append(format_observation([(passages[k]["title"], passages[k : k + 5])]))
    for t in world.topics:
        for wording in KINDS[t.kind][2:5]:
            question = wording.format(s=t.subject.plain)
            texts.append(f"user\n{build_user_prompt(question)}\nassistant\n")  # the template's roles
            texts.append(search_text([question, t.subject.plain]))
        texts.append(answer_text([o.plain for o in t.objects]))
    texts = [pattern.sub("", text) for text in texts]
    # each piece followed by a space (inside running text) and by punctuation (end of a title)
    texts += [" ".join(f"{p} {p}. {p}?" for p in name_parts())] * 20
    return texts


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _mark(out: Path, kind: str, seed: int) -> None:
    (out / TINY_MARKER).write_text(
        json.dumps(
            {"kind": kind, "seed": seed, "note": "tiny randomly initialised model; outputs are meaningless"}
        )
    )


def _train_tokenizer():
    """The tiny models' byte-level BPE tokenizer, trained on the demo's texts, with Qwen's special
    tokens and chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PIECES), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        _tokenizer_texts(),
        trainers.BpeTrainer(
            vocab_size=_VOCAB,
            special_tokens=_QWEN_SPECIALS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=_QWEN_SPECIALS[1:],
        model_max_length=32768,
    )
    hf_tok.chat_template = _QWEN_CHAT_TEMPLATE
    return hf_tok


def build_tiny_qwen3(out: str | os.PathLike, seed: int = 0, kv_heads: int = 2) -> Path:
    """Save a ~0.6M-parameter random Qwen3ForCausalLM and its tokenizer (with chat template).

    Two layers, 128 wide, two attention heads of 64. ``kv_heads=2`` gives each head its own values,
    so that what an attention layer moves is as wide as the residual stream: a head that attends
    to a token can then copy it (with one shared 64-wide value head, the demo's warm start never
    learned to write a name it had not seen; docs/cpu-training.md). ``kv_heads=1`` is the
    ~0.4M-parameter shape the CPU training tests' worlds were measured with.
    """
    _offline()
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    hf_tok = _train_tokenizer()
    torch.manual_seed(seed)
    # head_dim 64 is the smallest that GPU attention kernels (FlashInfer, FlashAttention 3) take,
    # so the same tiny model also serves the GPU smoke test under sglang.
    cfg = Qwen3Config(
        vocab_size=len(hf_tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=kv_heads,
        head_dim=64,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
        bos_token_id=None,
    )
    model = Qwen3ForCausalLM(cfg)
    model.generation_config.eos_token_id = hf_tok.eos_token_id
    model.generation_config.pad_token_id = hf_tok.pad_token_id
    model.save_pretrained(out)
    hf_tok.save_pretrained(out)
    _mark(out, "qwen3", seed)
    log.info("tiny random Qwen3 (%d parameters) saved to %s", sum(p.numel() for p in model.parameters()), out)
    return out


def save_random_cross_encoder(
    tok, out: str | os.PathLike, *, seed: int = 0, initializer_range: float = 0.02
) -> Path:
    """Save a random 2-layer XLM-RoBERTa sequence classifier (1 label) around ``tok``.

    Args:
        tok: a ``tokenizers.Tokenizer`` whose vocabulary holds ``<s> <pad> </s> <unk> <mask>``;
            its post-processor is set to XLM-R's pair template here.
        out: output directory (model + tokenizer, loadable by FlagEmbedding).
        seed: torch seed of the random weights.
        initializer_range: std of the random weights (larger spreads the scores apart).

    ``max_position_embeddings=514`` and ``model_max_length=512`` match bge-reranker-v2-m3, so
    FlagEmbedding's default ``max_length`` never indexes past the position table.
    """
    _offline()
    import torch
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast, XLMRobertaConfig, XLMRobertaForSequenceClassification

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", bos), ("</s>", eos)]
    )
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        cls_token="<s>",
        sep_token="</s>",
        mask_token="<mask>",
        model_max_length=512,
    )
    torch.manual_seed(seed)
    cfg = XLMRobertaConfig(
        vocab_size=len(hf_tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=514,
        num_labels=1,
        pad_token_id=hf_tok.pad_token_id,
        bos_token_id=bos,
        eos_token_id=eos,
        initializer_range=initializer_range,
    )
    XLMRobertaForSequenceClassification(cfg).save_pretrained(out)
    hf_tok.save_pretrained(out)
    return out


# The tiny reranker's vocabulary: each word of these lines is one piece, every printable ASCII
# character another (any English text tokenizes without <unk>, so FlagEmbedding's decode/re-encode
# round trip is exact for it).
_RERANKER_TEXTS = (
    "the quick brown fox jumps over the lazy dog",
    "which films were directed by the director",
    "lucene builds an inverted index of wikipedia passages",
    "a reranker scores query passage pairs",
    "rivers lakes mountains cities novels albums",
)
_RERANKER_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


def _reranker_vocab() -> list[tuple[str, float]]:
    """The tiny reranker's Unigram pieces with their log-probabilities, counted rather than trained:
    tokenizers' Unigram trainer sums its EM statistics in parallel, so its scores differ in the last
    digits from build to build, pieces of near-equal score change places, token ids move, and the
    random embeddings behind them score passages differently. Counting is exact: every build is
    byte-identical, and so are a fresh demo run's searches."""
    import math
    import string
    from collections import Counter

    words = Counter(w for line in _RERANKER_TEXTS for w in line.split())
    counts = Counter({"\u2581" + w: n for w, n in words.items()})
    counts["\u2581"] = sum(words.values())  # the word-start marker alone
    for c in string.ascii_letters + string.digits + string.punctuation:
        counts[c] = 1 + sum(n * w.count(c) for w, n in words.items())
    total = sum(counts.values())
    pieces = sorted(((p, math.log(n / total)) for p, n in counts.items()), key=lambda x: (-x[1], x[0]))
    return [(s, 0.0) for s in _RERANKER_SPECIALS] + pieces


def build_tiny_reranker(out: str | os.PathLike, seed: int = 0) -> Path:
    """Save a tiny random cross-encoder shaped like bge-reranker-v2-m3 (XLM-R with a small
    Unigram tokenizer, :func:`_reranker_vocab`); see :func:`save_random_cross_encoder`."""
    _offline()
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.Unigram(_reranker_vocab(), unk_id=_RERANKER_SPECIALS.index("<unk>")))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    out = save_random_cross_encoder(tok, out, seed=seed)
    _mark(out, "reranker", seed)
    log.info("tiny random reranker saved to %s", out)
    return out


def build(kind: str, out: str | os.PathLike, seed: int = 0) -> Path:
    """Build the tiny model ``kind`` (``qwen3`` or ``reranker``) into ``out``."""
    builders = {"qwen3": build_tiny_qwen3, "reranker": build_tiny_reranker}
    if kind not in builders:
        raise ValueError(f"unknown tiny model kind {kind!r}; expected one of {sorted(builders)}")
    return builders[kind](out, seed=seed)
