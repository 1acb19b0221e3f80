"""The benchmark's report: ``memory_bench.json`` assembled, written, and shown as a table.

Output ``memory_bench.json`` (schema ``vla_edge_ros.memory_bench/2``)::

    schema      "vla_edge_ros.memory_bench/2"
    config      model ("tiny preset, seed S" or the --model path), episodes, distractors [N],
                budgets [F], policies, cosine_signatures, classes K, seed, prototypes_per_class, prompt_tokens,
                tokens_per_frame, dof, kv_bytes_per_token, frame_hw, dms_targets, dms_window,
                dms_lead_in, compression_frames
    rows        one per policy x N x F (cosine: x signature; aura: x gate, budget_frames null;
                dms: x target ratio):
                  policy, gate (aura: surprise|every_frame|random|periodic, else null),
                  signature (cosine: keys|values|embeddings, else null),
                  gate_rate (aura baselines' write rate, else null), target_ratio (dms, else null),
                  distractors, budget_frames,
                  kv_capacity_tokens, protect_recent_frames (cosine, else null), episodes,
                  cue_kept (fraction of episodes; fifo/cosine/dms, else null),
                  cue_entries_kept, cue_centre_kept, compression, forced_evictions (dms, else null),
                  cue_attention, uniform_attention (means; fifo/cosine/dms, else null),
                  readout_accuracy (aura, else null), chance (1/K),
                  writes_per_frame, evictions (mean per episode; dms: tokens, not frames),
                  memory_bytes, kv_bytes, state_bytes (max over episodes, at the query)
    dms_compression  one per target ratio: target_ratio, window, frames, tokens_seen,
                compression (tokens seen / tokens kept, pooled over every layer and KV head),
                decision_compression (tokens decided / keep decisions: without the window's share),
                slot_compression (tokens seen / slots held), forced_evictions,
                held_per_head [layers][kv_heads], compression_per_head [layers][kv_heads]
                (null for a head that keeps nothing), page_tokens, pages_per_head [layers][kv_heads],
                kv_bytes_held (the pages in use, prompt included), kv_bytes_dense (every token seen and the
                prompt, every head), byte_compression (dense bytes / bytes the pages hold, the prompt's
                share out of both: what memory holds), byte_compression_per_layer [layers]
    aura_readout_ceiling  the aura readout applied to v_cue - v_query (what a memory returning the
                cue's value exactly would give; null without aura). When it is not above chance
                (two binomial standard errors), the aura recall claims are "not tested".
    overhead    one per policy: policy, arena_frames, frames, policy_ms (median per frame of the
                policy's own make_room + add_frame (+ frame_prefix)), add_frame_ms (median full
                engine.add_frame)
    claims      id, claim, verdict ("holds" | "fails" | "not tested"), evidence (the numbers)
    runtime_s   wall time of the run
    run         how the units ran (``parallel.run_figures``: workers, backend, units, resumed, failed,
                units_per_s, speedup)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ...model.config import ModelConfig
from ...model.layout import kv_bytes_per_token
from .claims import evaluate_claims
from .spec import FRAME_HW, MODEL_SEED, PROMPT, BenchSpec

SCHEMA = "vla_edge_ros.memory_bench/2"


def build_report(spec: BenchSpec, model_dir: Path | None, config: ModelConfig, rows: list[dict[str, Any]],
                 ceiling: float | None, compression: list[dict[str, Any]], overhead: list[dict[str, Any]],
                 run: dict[str, Any]) -> dict[str, Any]:
    """The report of a finished sweep, its claims judged; ``run``: ``parallel.run_figures``'s figures."""
    run = dict(run)
    return {
        "schema": SCHEMA,
        "config": {"model": str(model_dir) if model_dir else f"tiny preset, seed {MODEL_SEED}",
                   "episodes": spec.episodes, "distractors": list(spec.distractors), "budgets": list(spec.budgets),
                   "policies": list(spec.policies),
                   "cosine_signatures": list(spec.cosine_signatures), "classes": spec.classes,
                   "seed": spec.seed, "prototypes_per_class": spec.prototypes_per_class,
                   "prompt_tokens": len(PROMPT), "tokens_per_frame": config.vision.tokens_per_frame,
                   "dof": config.action.dof, "kv_bytes_per_token": kv_bytes_per_token(config),
                   "frame_hw": list(FRAME_HW), "dms_targets": list(spec.dms_targets), "dms_window": spec.dms_window,
                   "dms_lead_in": spec.dms_lead_in, "compression_frames": spec.compression_frames},
        "rows": rows,
        "aura_readout_ceiling": ceiling,
        "dms_compression": compression,
        "overhead": overhead,
        "claims": evaluate_claims(rows, spec.episodes, 1.0 / spec.classes, ceiling, compression,
                                  spec.cosine_signatures[0]),
        "runtime_s": run.pop("seconds"),
        "run": run,
    }


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)


def format_table(report: dict[str, Any]) -> str:
    """The report as text: one row per policy x N x F (aura: x gate), overheads, then the claims."""
    header = (f"{'policy':<6} {'variant':<13} {'N':>4} {'F':>3} {'cue kept':>8} {'entries':>7} {'cue attn':>8} "
              f"{'uniform':>7} {'readout':>7} {'chance':>6} {'ratio':>6} {'writes/fr':>9} {'evict':>6} "
              f"{'memory B':>10} {'kv B':>10} {'state B':>7}")
    lines = [header, "-" * len(header)]
    for r in report["rows"]:
        gate = r["gate"] or (f"sig {r['signature']}" if r["signature"] else "-")
        if r["gate"] in ("random", "periodic"):
            gate += f" {r['gate_rate']:.2f}"
        if r["target_ratio"] is not None:
            gate = f"target {r['target_ratio']:g}"
        lines.append(f"{r['policy']:<6} {gate:<13} {r['distractors']:>4} {_cell(r['budget_frames'], 'd'):>3} "
                     f"{_cell(r['cue_kept'], '.2f'):>8} {_cell(r['cue_entries_kept'], '.2f'):>7} "
                     f"{_cell(r['cue_attention'], '.4f'):>8} "
                     f"{_cell(r['uniform_attention'], '.4f'):>7} {_cell(r['readout_accuracy'], '.2f'):>7} "
                     f"{r['chance']:>6.2f} {_cell(r['compression'], '.2f'):>6} {r['writes_per_frame']:>9.3f} "
                     f"{r['evictions']:>6.1f} {r['memory_bytes']:>10,} {r['kv_bytes']:>10,} {r['state_bytes']:>7,}")
    lines.append("")
    for c in report["dms_compression"]:
        heads = [r for layer in c["compression_per_head"] for r in layer]
        finite = [r for r in heads if r is not None]
        lines.append(f"dms target {c['target_ratio']:g}x over {c['frames']} frames (window {c['window']}): "
                     f"tokens seen / kept {c['compression']:.2f}x pooled over heads (per head "
                     f"{min(finite, default=float('nan')):.2f}..{max(finite, default=float('nan')):.2f}"
                     f"{', ' + str(heads.count(None)) + ' keep nothing' if None in heads else ''}), "
                     f"{c['decision_compression']:.2f}x of the decisions, {c['slot_compression']:.2f}x of the "
                     f"slots held; {c['forced_evictions']} forced")
        layers = ", ".join(_cell(r, ".2f") for r in c["byte_compression_per_layer"])
        lines.append(f"    bytes: {c['kv_bytes_held']:,} B of KV in pages of {c['page_tokens']} against "
                     f"{c['kv_bytes_dense']:,} B dense: {_cell(c['byte_compression'], '.2f')}x pooled "
                     f"(per layer {layers})")
    lines.append("")
    for o in report["overhead"]:
        lines.append(f"overhead {o['policy']:<6} at {o['arena_frames']} frames: policy {o['policy_ms']:.3f} ms/frame "
                     f"(median of {o['frames']}), whole add_frame {o['add_frame_ms']:.2f} ms")
    lines.append("")
    for c in report["claims"]:
        lines.append(f"claim {c['id']:<2} {c['verdict'].upper():<10} {c['claim']}")
    if report["aura_readout_ceiling"] is not None:
        lines.append(f"aura readout ceiling (v_cue - v_query, a perfect memory): {report['aura_readout_ceiling']:.2f} "
                     f"(chance {1 / report['config']['classes']:.2f})")
    return "\n".join(lines)


def write_report(report: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "memory_bench.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path
