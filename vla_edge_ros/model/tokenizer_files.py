"""Write a checkpoint's tokenizer: ``tokenizer.json``, ``tokenizer_config.json`` and ``chat_template.jinja``.

A real Qwen2 checkpoint ships its own; the small models this package builds (``vla-edge init-model``, the
trainer) need one too, made offline and deterministically: a byte-level BPE trained with the ``tokenizers``
library on a given corpus, the layout transformers saves, so that ``AutoTokenizer`` loads it as it would a
hub checkpoint. The vocabulary stays below the last 256 ids, which the ``bins`` action head reads as action
bins: an instruction's tokens are never action tokens.

The chat template is ChatML, the turn format of Qwen2 (``<|im_start|>role\\ncontent<|im_end|>\\n``), with an
optional system turn and the generation prompt; it is ours, written for these models.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from .config import NUM_ACTION_BINS

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TEMPLATE_FILE = "chat_template.jinja"


def write_tokenizer(out: str | Path, corpus: Iterable[str], vocab_size: int) -> Path:
    """Train a byte-level BPE on ``corpus`` into ``out`` (a model directory) for a model of ``vocab_size``;
    the same corpus always gives the same files. Returns ``out``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    size = vocab_size - NUM_ACTION_BINS
    if size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size {vocab_size} leaves {size} ids below the action bins: a byte-level tokenizer "
                         f"needs at least {256 + len(SPECIAL_TOKENS)}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(sorted(set(corpus)), trainer=trainer)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / TEMPLATE_FILE).write_text(CHAT_TEMPLATE)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 32768,
              "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
              "additional_special_tokens": list(SPECIAL_TOKENS[1:])}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
