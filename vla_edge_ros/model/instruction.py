"""An instruction in words -> the prompt's token ids, with the checkpoint's own tokenizer and chat template.

It is what transformers' ``apply_chat_template(..., add_generation_prompt=True)`` does, so that a checkpoint
reads its instructions as it was trained to:

- the tokenizer is the directory's ``tokenizer.json``, loaded with the ``tokenizers`` library;
- the template is ``chat_template.jinja`` (what transformers 5 saves), else ``tokenizer_config.json``'s
  ``chat_template`` (a string, or the ``default`` entry of a list of named templates), rendered by jinja2 in
  a sandbox with ``trim_blocks`` and ``lstrip_blocks``, the loop-control extension, a ``tojson`` filter that
  does not escape HTML, ``raise_exception``, and the special tokens of ``tokenizer_config.json`` as
  variables; the conversation is one user turn holding the instruction, and the generation prompt is asked
  for;
- the rendered text is tokenized without adding special tokens (the template wrote them). Without a
  template the instruction itself is tokenized, special tokens added as the tokenizer's post-processor
  says (as ``tokenizer(text)`` does).

An instruction comes from a person or a topic, so it is bounded before anything costly: it must be text
(no lone surrogates, no control characters but tab and newline), not blank, at most
``MAX_CHARS_PER_TOKEN`` characters per allowed token before tokenizing, and at most ``max_tokens`` tokens
after. A refusal is an InstructionError saying which; the caller keeps its current instruction.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .config import NUM_ACTION_BINS

TEMPLATE_FILE = "chat_template.jinja"
MAX_CHARS_PER_TOKEN = 16  # a token of any real tokenizer covers far fewer; the bound before tokenizing
_ALLOWED_CONTROLS = {"\t", "\n"}


class InstructionError(ValueError):
    """An instruction that cannot become a prompt: blank, too long, not text, or no tokenizer to read it."""


@dataclass(frozen=True)
class InstructionTokenizer:
    """A checkpoint's tokenizer and chat template; ``prompt_ids`` turns an instruction into prompt token ids."""

    tokenizer: Any  # tokenizers.Tokenizer
    template: Any | None  # a compiled jinja2 Template, or None: the instruction is tokenized as it is
    special_tokens: dict[str, str]  # bos_token, eos_token, ... as the template sees them
    vocab_size: int  # the model's: ids at or above vocab_size - NUM_ACTION_BINS are action bins

    @classmethod
    def load(cls, model_dir: str | Path, vocab_size: int) -> InstructionTokenizer | None:
        """The tokenizer of ``model_dir``, or None when it has no ``tokenizer.json``."""
        from tokenizers import Tokenizer

        model_dir = Path(model_dir)
        if not (model_dir / "tokenizer.json").is_file():
            return None
        try:
            tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises its own exception type for a malformed file
            raise InstructionError(f"{model_dir / 'tokenizer.json'}: not a tokenizer the tokenizers library reads: "
                                   f"{' '.join(str(exc).split())[:200]}") from None
        config = _read_config(model_dir)
        source = _template_source(model_dir, config)
        template = _compile(source, model_dir) if source is not None else None
        special = {key: value for key, value in config.items()
                   if key.endswith("_token") and isinstance(value, str)}
        return cls(tokenizer, template, special, vocab_size)

    def render(self, instruction: str) -> str:
        """The text the model reads for ``instruction`` (the chat template's rendering, or the instruction)."""
        if self.template is None:
            return instruction
        return self.template.render(messages=[{"role": "user", "content": instruction}],
                                    add_generation_prompt=True, **self.special_tokens)

    def prompt_ids(self, instruction: str, max_tokens: int) -> np.ndarray:
        """The prompt's token ids for ``instruction``; InstructionError when it is refused (module doc)."""
        ids = self.template_ids(check_text(instruction, max_tokens))
        if ids.size > max_tokens:
            raise InstructionError(f"instruction too long: {ids.size} tokens, at most {max_tokens} "
                                   "(reasoning.instruction_max_tokens)")
        first_bin = self.vocab_size - NUM_ACTION_BINS
        if ids.size and int(ids.max()) >= first_bin:
            raise InstructionError(f"the tokenizer gives id {int(ids.max())}, at or above the first action bin "
                                   f"{first_bin}: it does not belong to this model")
        return ids

    def template_ids(self, content: str) -> np.ndarray:
        """The token ids of the template around ``content``, unchecked: ``prompt_ids`` checks an instruction
        first; an evaluation's instruction-blind ablation renders an empty user turn with this."""
        encoding = self.tokenizer.encode(self.render(content), add_special_tokens=self.template is None)
        return np.asarray(encoding.ids, dtype=np.int32)


def check_text(instruction: object, max_tokens: int) -> str:
    """``instruction`` when it is text a prompt can be made of; InstructionError saying why not."""
    if not isinstance(instruction, str):
        raise InstructionError(f"an instruction is text, got {type(instruction).__name__}")
    if len(instruction) > max_tokens * MAX_CHARS_PER_TOKEN:
        raise InstructionError(f"instruction too long: {len(instruction):,} characters, at most "
                               f"{max_tokens * MAX_CHARS_PER_TOKEN:,} ({max_tokens} tokens)")
    try:
        instruction.encode("utf-8")
    except UnicodeEncodeError:
        raise InstructionError("instruction is not valid text (it holds a lone surrogate, from undecodable "
                               "bytes)") from None
    bad = next((c for c in instruction if unicodedata.category(c) == "Cc" and c not in _ALLOWED_CONTROLS), None)
    if bad is not None:
        raise InstructionError(f"instruction holds the control character {bad!r}")
    if not instruction.strip():
        raise InstructionError("instruction is empty")
    return instruction


def _read_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InstructionError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise InstructionError(f"{path}: not a JSON object")
    return config


def _template_source(model_dir: Path, config: dict[str, Any]) -> str | None:
    """The chat template's text: chat_template.jinja, else tokenizer_config.json's (None: there is none)."""
    file = model_dir / TEMPLATE_FILE
    if file.is_file():
        return file.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": "..."}, ...]
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise InstructionError(f"{model_dir / 'tokenizer_config.json'}: chat_template is not a string")
    return template


def _compile(source: str, model_dir: Path) -> Any:
    """The template compiled as transformers compiles chat templates (module doc)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    try:
        return environment.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise InstructionError(f"{model_dir}: the chat template does not compile: {exc}") from None
