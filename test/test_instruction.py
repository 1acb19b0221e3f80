"""Instructions in words: the checkpoint's tokenizer and chat template give transformers' token ids exactly, and
every instruction that cannot become a prompt is refused with its reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vla_edge_ros.config import ConfigError, parse_settings
from vla_edge_ros.model.init_model import preset, write_random_model
from vla_edge_ros.model.instruction import MAX_CHARS_PER_TOKEN, InstructionError, InstructionTokenizer
from vla_edge_ros.model.tokenizer_files import TEMPLATE_FILE, write_tokenizer
from vla_edge_ros.runtime.loader import load_engine, load_model, prompt_ids, reads_words

CORPUS = [f"please drive to the {colour} target" for colour in ("red", "green", "blue", "yellow")] + [
    "go to the red one", "reach the cued target", "user", "assistant", "system"]
PHRASINGS = [
    "please drive to the red target",
    "Go to the BLUE one, then stop.",
    "fahre zum grünen Ziel",  # letters outside the corpus: byte-level pieces
    "去红色的目标",
    "reach  the  cued\ttarget\nnow 🚗",
    " leading and trailing spaces ",
]


@pytest.fixture(scope="module", params=["tiny", "qwen2-vl-tiny"])
def model_dir(request, tmp_path_factory) -> Path:
    """A Qwen2 and a Qwen2-VL checkpoint with a tokenizer trained on CORPUS."""
    out = write_random_model(tmp_path_factory.mktemp("models") / request.param, preset(request.param), seed=0)
    return write_tokenizer(out, CORPUS, preset(request.param).vocab_size)


def _transformers(model_dir: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(model_dir))


@pytest.mark.parametrize("instruction", PHRASINGS)
def test_prompt_ids_equal_transformers_apply_chat_template(model_dir, instruction):
    ours = InstructionTokenizer.load(model_dir, preset("tiny").vocab_size).prompt_ids(instruction, 64)
    theirs = _transformers(model_dir).apply_chat_template([{"role": "user", "content": instruction}],
                                                          add_generation_prompt=True, tokenize=True)
    theirs = theirs["input_ids"] if isinstance(theirs, dict) or hasattr(theirs, "keys") else theirs
    assert ours.tolist() == list(theirs)


# A template written into tokenizer_config.json (the older layout) that leans on what transformers' rendering
# provides: trim_blocks / lstrip_blocks around indented blocks, loop controls, the tojson filter (no HTML
# escaping), raise_exception and the special tokens as variables.
CONFIG_TEMPLATE = """{% if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{% else %}
    {{- '<|im_start|>system\\nfollow ' + ({'task': 'reach', 'note': '<&>'} | tojson) + '<|im_end|>\\n' }}
{% endif %}
{% for message in messages %}
    {% if message['role'] == 'system' %}{% continue %}{% endif %}
    {% if message['role'] not in ['user', 'assistant'] %}{{ raise_exception('bad role') }}{% endif %}
    {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + eos_token + '\\n' }}
{% endfor %}
{% if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{% endif %}
"""


def test_a_template_in_tokenizer_config_renders_as_transformers_renders_it(tmp_path):
    model = write_tokenizer(tmp_path / "m", CORPUS, 2048)
    (model / TEMPLATE_FILE).unlink()
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CONFIG_TEMPLATE}))
    ours = InstructionTokenizer.load(model, 2048)
    hf = _transformers(model)
    for instruction in PHRASINGS:
        expected = hf.apply_chat_template([{"role": "user", "content": instruction}], add_generation_prompt=True,
                                          tokenize=False)
        assert ours.render(instruction) == expected and '"<&>"' in expected
        assert ours.prompt_ids(instruction, 256).tolist() == hf(expected, add_special_tokens=False).input_ids


def test_without_a_template_the_instruction_is_tokenized_as_a_tokenizer_call_does(tmp_path):
    model = write_tokenizer(tmp_path / "m", CORPUS, 2048)
    (model / TEMPLATE_FILE).unlink()
    ours = InstructionTokenizer.load(model, 2048)
    assert ours.template is None
    assert ours.prompt_ids("go to the red one", 64).tolist() == _transformers(model)("go to the red one").input_ids


def test_the_vocabulary_stays_below_the_action_bins(tmp_path):
    tokenizer = InstructionTokenizer.load(write_tokenizer(tmp_path / "m", CORPUS * 50, 600), 600)
    assert tokenizer.tokenizer.get_vocab_size() <= 600 - 256
    with pytest.raises(ValueError, match="leaves 200 ids below the action bins"):
        write_tokenizer(tmp_path / "small", CORPUS, 456)


def test_a_directory_without_tokenizer_json_has_no_tokenizer(tiny_model):
    assert InstructionTokenizer.load(tiny_model, 2048) is None


@pytest.mark.parametrize("instruction, reason", [
    ("", "instruction is empty"),
    ("   \n\t ", "instruction is empty"),
    ("go\x00 now", "control character '\\x00'"),
    ("go \udcff now", "not valid text"),
    ("x" * (64 * MAX_CHARS_PER_TOKEN + 1), "instruction too long: 1,025 characters"),
    (" ".join(["zebra"] * 60), "instruction too long: "),  # few characters, many tokens
    (b"go to the red one", "an instruction is text, got bytes"),
])
def test_bad_instructions_are_refused_with_the_reason(tmp_path, instruction, reason):
    tokenizer = InstructionTokenizer.load(write_tokenizer(tmp_path / "m", CORPUS, 2048), 2048)
    with pytest.raises(InstructionError, match=__import__("re").escape(reason)):
        tokenizer.prompt_ids(instruction, 64)


def test_a_malformed_tokenizer_file_is_one_clear_error(tmp_path):
    model = write_tokenizer(tmp_path / "m", CORPUS, 2048)
    (model / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "nonsense"}}')
    with pytest.raises(InstructionError, match="not a tokenizer the tokenizers library reads"):
        InstructionTokenizer.load(model, 2048)
    (model / "tokenizer.json").unlink()
    write_tokenizer(model, CORPUS, 2048)
    (model / TEMPLATE_FILE).write_text("{% for m in messages %}{{ m['content'] }")
    with pytest.raises(InstructionError, match="chat template does not compile"):
        InstructionTokenizer.load(model, 2048)


# --- the configuration and the runtime --------------------------------------------------------------------


def _node(model_dir: Path, **reasoning) -> dict:
    return {"reasoning": {"ros__parameters": {"model_dir": str(model_dir), "backend": "numpy",
                                              "kv_capacity_tokens": 256, **reasoning}}}


def test_the_engine_prefills_the_instruction_s_tokens(tmp_path):
    model = write_tokenizer(write_random_model(tmp_path / "m", preset("tiny"), seed=0), CORPUS, 2048)
    settings = parse_settings(_node(model, instruction="go to the red one"), "robot.yaml")
    expected = InstructionTokenizer.load(model, 2048).prompt_ids("go to the red one", 64)
    assert load_engine(settings).engine.prompt_ids.tolist() == expected.tolist()


def test_a_config_that_gives_token_ids_and_no_instruction_makes_them_the_prompt(tmp_path):
    """The defaults name an instruction (the shipped model's); a file that gives prompt_token_ids and no
    instruction means its ids, one that gives both keeps both (words for a model with a tokenizer)."""
    assert parse_settings(_node(tmp_path, prompt_token_ids=[1, 2]), "r.yaml")["reasoning"]["instruction"] == ""
    both = parse_settings(_node(tmp_path, instruction="go", prompt_token_ids=[1, 2]), "r.yaml")["reasoning"]
    assert (both["instruction"], both["prompt_token_ids"]) == ("go", [1, 2])
    assert parse_settings(_node(tmp_path), "r.yaml")["reasoning"]["instruction"] == "please drive to the red target"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vla_edge_ros", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_a_model_without_a_tokenizer_reads_prompt_token_ids_whatever_instruction_says(tiny_model, tmp_path):
    """No tokenizer.json: the prompt is prompt_token_ids (the instruction cannot be read), and a command runs."""
    settings = parse_settings(_node(tiny_model, instruction="go to the red one", prompt_token_ids=[5, 6, 7]), "r.yaml")
    checkpoint = load_model(settings)
    assert not reads_words(settings, checkpoint) and prompt_ids(settings, checkpoint).tolist() == [5, 6, 7]
    config = tmp_path / "robot.yaml"
    config.write_text(yaml.safe_dump(_node(tiny_model, instruction="go to the red one", prompt_token_ids=[5, 6, 7])))
    done = _cli("engine", "--frames", "1", "--config", str(config), cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_a_refused_instruction_in_a_config_is_one_line_and_exit_2(tmp_path):
    model = write_tokenizer(write_random_model(tmp_path / "m", preset("tiny"), seed=0), CORPUS, 2048)
    config = tmp_path / "robot.yaml"
    config.write_text(yaml.safe_dump(_node(model, instruction=" ".join(["zebra"] * 60))))
    done = _cli("plan", "--config", str(config), cwd=tmp_path)
    assert done.returncode == 2 and "instruction too long" in done.stderr and "Traceback" not in done.stderr
