"""Shell: generated chat models for ``generate`` services: a small Llama-style causal LM with
seeded random weights, a byte-level BPE tokenizer trained here, and a chat template.

Nothing is downloaded and no other project's text is used: the tokenizer is trained on a
synthetic corpus of pseudo-words drawn from a seeded syllable grammar, so it is a real
byte-level BPE (any UTF-8 text encodes and decodes back) whose vocabulary is exactly
``GENERATED_VOCAB_SIZE`` ids, the generated models' vocabulary.

Random weights give near-uniform next-token logits, on which batched and lone greedy runs
may pick different tokens on float noise. The output layer is scaled by ``LOGIT_SCALE`` so
top-1 margins are clear (the model's verdicts stay meaningless; its cost is real).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

from arl_tangram.managers.gpu.models import (
    GENERATED_VOCAB_SIZE,
    _transformers,
    causal_lm_config,
)

LOGIT_SCALE = 24.0
BOS, EOS, PAD = "<|bos|>", "<|endoftext|>", "<|pad|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, BOS, EOS, IM_START, IM_END)  # ids 0..4, in this order
# ChatML-style turns; the generation prompt opens the assistant's turn.
CHAT_TEMPLATE = (
    "{% for m in messages %}" + IM_START + "{{ m['role'] }}\n{{ m['content'] }}" + IM_END + "\n"
    "{% endfor %}{% if add_generation_prompt %}" + IM_START + "assistant\n{% endif %}"
)
_SYLLABLES_SEED = 7


def _corpus(num_words: int = 60_000) -> list[str]:
    """Pseudo-words and punctuation from a seeded syllable grammar (deterministic)."""
    rng = random.Random(_SYLLABLES_SEED)
    onsets = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t",
              "v", "w", "z", "br", "ch", "cl", "dr", "gr", "pl", "st", "th", "tr"]  # fmt: skip
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io", "y"]
    codas = ["", "", "n", "r", "s", "l", "m", "nd", "st", "ng"]
    marks = [".", ",", "?", "!", ":", ";", "\n", " 0", " 1", " 42", " 7/10", " yes", " no"]
    lines, line = [], []
    for _ in range(num_words):
        word = "".join(
            rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
            for _ in range(rng.choice((1, 1, 2, 2, 3)))
        )
        line.append(word.capitalize() if rng.random() < 0.1 else word)
        if rng.random() < 0.08:
            line.append(rng.choice(marks))
        if len(line) > 16:
            lines.append(" ".join(line))
            line = []
    return lines


def build_tokenizer(vocab_size: int = GENERATED_VOCAB_SIZE) -> Any:
    """A ``PreTrainedTokenizerFast`` of exactly ``vocab_size`` ids, with the chat template.

    Deterministic: the same corpus and trainer settings give the same vocabulary and merges.
    """
    tf = _transformers()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    core = Tokenizer(models.BPE(unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_corpus(), trainer=trainer)
    if core.get_vocab_size() != vocab_size:
        raise RuntimeError(
            f"the tokenizer learned {core.get_vocab_size()} ids, not {vocab_size}: grow the corpus"
        )
    tokenizer = tf.PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD,
        model_max_length=2048, clean_up_tokenization_spaces=False,
    )  # fmt: skip
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def generate_chat_lm(
    cache_dir: str | Path, size_bytes: int, seed: int = 0, dtype: str = "float32"
) -> Path:
    """Folder of a chat causal LM of about ``size_bytes``: config, safetensors weights drawn
    from ``seed`` (output layer scaled by ``LOGIT_SCALE``), tokenizer and chat template.

    Cached by (size, seed, dtype) and written atomically, as ``generate_causal_lm``.
    Register it with handler ``generate`` (or ``logprobs``: it is an ordinary causal LM).
    """
    cache = Path(cache_dir)
    target = cache / f"chat-lm-{size_bytes}-seed{seed}-{dtype}"
    if (target / "config.json").exists():
        return target
    tf = _transformers()
    import torch

    cache.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    fields = causal_lm_config(size_bytes, dtype)
    keep = {k: v for k, v in fields.items() if k not in ("architectures", "model_type", "dtype")}
    ids = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    config = tf.LlamaConfig(**keep, **ids)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        module = tf.LlamaForCausalLM(config).to(getattr(torch, dtype))
    finally:
        torch.random.set_rng_state(state)
    with torch.no_grad():
        module.lm_head.weight.mul_(LOGIT_SCALE)
    module.generation_config.pad_token_id = 0
    staging = Path(tempfile.mkdtemp(prefix=".arl-tangram-gen-", dir=cache))
    try:
        module.save_pretrained(str(staging), safe_serialization=True)
        tokenizer.save_pretrained(str(staging))
        (staging / "arl_tangram.json").write_text(json.dumps({"logit_scale": LOGIT_SCALE}))
        if not target.exists():
            os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


TOKENIZER_CACHE = Path.home() / ".cache" / "arl-tangram" / "tokenizers"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def shared_tokenizer(cache: Path = TOKENIZER_CACHE) -> Path:
    """The folder of ``build_tokenizer()``'s files, trained once per machine (training takes
    tens of seconds on a busy host; every generated model after that copies three files).
    Written atomically, like the models."""
    target = cache / f"bpe-{GENERATED_VOCAB_SIZE}-v1"
    if (target / "tokenizer.json").exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".arl-tangram-tok-", dir=cache))
    try:
        build_tokenizer().save_pretrained(str(staging))
        if not target.exists():
            os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def add_tokenizer(folder: Path) -> None:
    """Give a generated model folder the generated tokenizer (its vocabulary is the model's),
    so that string prompts work on it; a folder that has one is left as it is."""
    if (folder / "tokenizer.json").exists():
        return
    source = shared_tokenizer()
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            part = folder / f".{name}.part"
            shutil.copyfile(source / name, part)
            os.replace(part, folder / name)  # tokenizer.json last-but-whole: never half a file


def generate_causal_lm(
    cache_dir: str | Path, size_bytes: int, seed: int = 0, dtype: str = "float32", num_labels: int = 0
) -> Path:
    """Folder of a causal LM of about ``size_bytes`` with weights drawn from ``seed`` and the
    generated tokenizer (``add_tokenizer``: its vocabulary is the model's); with
    ``num_labels`` > 0, a sequence-classification (reward) head of that many classes instead
    of the LM head (load it as a ``classify`` service).

    Cached by (size, seed, dtype): a second call returns the same folder without work. The
    folder appears atomically (written under a temporary name, then renamed), so concurrent
    generators and interrupted runs never leave a half-written model behind.
    """
    cache = Path(cache_dir)
    head = f"-cls{num_labels}" if num_labels > 0 else ""
    target = cache / f"causal-lm-{size_bytes}-seed{seed}-{dtype}{head}"
    if (target / "config.json").exists():
        add_tokenizer(target)  # folders generated before models came with a tokenizer
        return target
    tf = _transformers()
    import torch

    cache.mkdir(parents=True, exist_ok=True)
    fields = causal_lm_config(size_bytes, dtype)
    config = tf.LlamaConfig(
        **{k: v for k, v in fields.items() if k not in ("architectures", "model_type", "dtype")}
    )
    if num_labels > 0:
        config.num_labels = num_labels
        config.pad_token_id = 0  # the head reads the last non-padding token
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model_class = tf.LlamaForSequenceClassification if num_labels > 0 else tf.LlamaForCausalLM
        module = model_class(config).to(getattr(torch, dtype))
    finally:
        torch.random.set_rng_state(generator_state)
    staging = Path(tempfile.mkdtemp(prefix=".arl-tangram-gen-", dir=cache))
    try:
        module.save_pretrained(str(staging), safe_serialization=True)
        add_tokenizer(staging)  # string prompts work: the generated BPE has the model's vocabulary
        if not target.exists():  # another process may have won the race: keep its copy
            os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target
