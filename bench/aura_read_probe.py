"""How well a checkpoint's decoder reads its aura memory, teacher-forced on fresh cue-reach demonstrations.

Closed-loop success (`vla-edge evaluate`) is the judge of a memory; when aura fails there, this says why: the
action error (the training loss's, on the frames after the cue has gone) when the decoder sees

- the whole episode as KV (what fifo over the whole episode reads): the floor;
- the aura memory as its gate writes it, and with the cue frame's write forced (``stages.write_labels``);
- the aura memory with no writes: the ceiling, the policy guessing.

A memory that holds the cue but sits near "no writes" is read too weakly; one whose forced row is good and
gate row is not writes the wrong frames. Frames every k-th tick for each stride: a chunked model's runtime
stores one every 12. Demonstrations come from ``--seed`` (``demos.demo_seed``: never a training phase's).

    .venv/bin/python bench/aura_read_probe.py --model models/sim [--model DIR ...] \
        [--recipe models/sim/recipe.yaml] [--episodes 16] [--seed 987654] [--strides 1,12]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.model.init_model import AURA_DIM
from vla_edge_ros.model.instruction import InstructionTokenizer
from vla_edge_ros.train.demos import record_demos
from vla_edge_ros.train.recipe import load_recipe
from vla_edge_ros.train.stages import action_error, aura_unroll, make_batch, sequence_actions, write_labels
from vla_edge_ros.train.torch_model import VlaModel
from vla_edge_ros.train.trainer import load_weights
from vla_edge_ros.train.wording import DEFAULT_PROMPT, Wording
from vla_edge_ros.worlds.sim.world import TaskSpec

ROWS = ("whole episode", "aura, gate", "aura, cue written", "aura, no writes")


def probe(model_dir: Path, instructions: tuple[str, ...], episodes: int, seed: int, strides: list[int],
          beta: float = 0.5) -> list[dict[str, float]]:
    """One row per stride: each ``ROWS`` error and the gate's writes per frame."""
    config = load_checkpoint(model_dir).config
    model = VlaModel(config, AURA_DIM)
    load_weights(model, model_dir)
    model.eval()
    tokenizer = (InstructionTokenizer.load(model_dir, config.vocab_size)
                 if (model_dir / "tokenizer.json").is_file() else None)
    wording = Wording(instructions if tokenizer else (), DEFAULT_PROMPT, tokenizer)
    demos = record_demos([TaskSpec(name="cue-reach")], episodes, seed, config.vision.image_size, wording,
                         config.action.chunk)
    rows = []
    for stride in strides:
        batch = make_batch(demos, [np.arange(0, len(demo.frames), stride) for demo in demos])
        after_cue = batch.valid & ~batch.cue
        with torch.no_grad():
            whole, _ = sequence_actions(model, batch)
            gate = aura_unroll(model, batch, beta)
            forced = [aura_unroll(model, batch, beta, writes)
                      for writes in (write_labels(batch), torch.zeros(batch.valid.shape))]
            errors = [action_error(model, actions, batch.labels, after_cue)
                      for actions in (whole, *(model.actions(run.hidden) for run in (gate, *forced)))]
        rows.append({"stride": stride, **{name: float(error) for name, error in zip(ROWS, errors)},
                     "gate writes / frame": float(gate.writes[batch.valid].mean())})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, action="append", required=True)
    parser.add_argument("--recipe", type=Path, default=None,
                        help="its last phase's instruction templates word the demonstrations (a model with words)")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--seed", type=int, default=987654)
    parser.add_argument("--strides", type=lambda text: [int(part) for part in text.split(",")], default=[1, 12])
    args = parser.parse_args()
    print("| model | stride | " + " | ".join(ROWS) + " | gate writes / frame |")
    print("|---" * (len(ROWS) + 3) + "|")
    try:
        instructions = load_recipe(args.recipe).phases[-1].spec.instructions if args.recipe else ()
        for model_dir in args.model:
            for row in probe(model_dir, instructions, args.episodes, args.seed, args.strides):
                cells = [f"{row[name]:.3f}" for name in (*ROWS, "gate writes / frame")]
                print(f"| {model_dir} | {row['stride']} | " + " | ".join(cells) + " |", flush=True)
    except (OSError, ValueError) as error:  # a missing or foreign checkpoint, a bad recipe: one line, no traceback
        print(f"aura_read_probe: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
