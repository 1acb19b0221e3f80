"""The benchmark's claims, each judged from the measured rows; nothing here knows the answer in advance.

1   cosine keeps the cue where fifo lost it.
2a  aura's state is the same size for every N.
2b  the surprise gate writes several times less than writing every frame, and reads out as well.
3   random and periodic gates at the surprise gate's write budget read out worse than it.
4   dms reaches its target compression; 4c its pages free the bytes; 4b it keeps the cue's token.

A claim is "not tested" when nothing measured it, or when it compares aura readouts while the readout
cannot tell the classes apart even from the cue itself (its ceiling is not above chance).
"""

from __future__ import annotations

from typing import Any

from ...memory.cosine import SIGNATURES
from .scoring import above_chance
from .spec import AURA_GATES

SEVERAL = 3.0  # "several times fewer writes" means at least this factor
REACHES = 0.95  # "dms reaches r x compression" means a measured ratio of at least this times r
FREES = 0.85  # "dms frees the memory it compresses": bytes held shrink at least this share of the token ratio


def evaluate_claims(rows: list[dict[str, Any]], episodes: int, chance: float, ceiling: float | None,
                    compression: list[dict[str, Any]], signature: str = SIGNATURES[0]) -> list[dict[str, Any]]:
    """Each claim's verdict from the measured rows; nothing here knows the answer in advance."""
    def find(policy: str, **where) -> list[dict[str, Any]]:
        return [r for r in rows if r["policy"] == policy and all(r[k] == v for k, v in where.items())]

    def verdict(tested: bool, passed: list[bool]) -> str:
        return "not tested" if not (tested and passed) else "holds" if all(passed) else "fails"

    cells = [{"distractors": f["distractors"], "budget_frames": f["budget_frames"], "fifo_cue_kept": f["cue_kept"],
              "cosine_cue_kept": c["cue_kept"], "cosine_cue_attention": c["cue_attention"],
              "uniform_attention": c["uniform_attention"]}
             for f in find("fifo") if f["cue_kept"] == 0
             for c in find("cosine", distractors=f["distractors"], budget_frames=f["budget_frames"],
                           signature=signature)]
    claims = [{"id": "1", "claim": f"cosine ({signature} signature) keeps the cue (in most episodes) in every cell "
                                    "where fifo lost it in all",
               "verdict": verdict(True, [c["cosine_cue_kept"] > 0.5 for c in cells]), "evidence": cells}]

    sizes = sorted({r["state_bytes"] for r in find("aura")})
    claims.append({"id": "2a", "claim": "aura state bytes are the same for every number of distractors",
                   "verdict": verdict(True, [len(sizes) == 1] if sizes else []),
                   "evidence": {"state_bytes": sizes, "distractors": sorted({r["distractors"] for r in find("aura")})}})
    per_n = []
    for surprise in find("aura", gate="surprise"):
        gates = {r["gate"]: r for r in find("aura", distractors=surprise["distractors"])}
        per_n.append({"distractors": surprise["distractors"], "chance": chance, "readout_ceiling": ceiling,
                      **{f"{g}_accuracy": gates[g]["readout_accuracy"] for g in AURA_GATES},
                      **{f"{g}_writes_per_frame": gates[g]["writes_per_frame"] for g in AURA_GATES}})
    # recall comparisons mean nothing when the readout cannot tell the classes apart from the cue itself
    readable = ceiling is not None and above_chance(ceiling, chance, episodes)
    claims.append({"id": "2b", "claim": f"the surprise gate writes at least {SEVERAL:g}x less than write-every-frame, "
                                         "at equal or better readout accuracy that is above chance, for every N",
                   "verdict": verdict(readable, [
                       c["every_frame_writes_per_frame"] >= SEVERAL * c["surprise_writes_per_frame"]
                       and c["surprise_accuracy"] >= c["every_frame_accuracy"]
                       and above_chance(c["surprise_accuracy"], chance, episodes) for c in per_n]),
                   "evidence": per_n})
    claims.append({"id": "3", "claim": "random and periodic gates at the surprise gate's write budget read out less "
                                        "accurately than the surprise gate, for every N",
                   "verdict": verdict(readable, [
                       c["surprise_accuracy"] > max(c["random_accuracy"], c["periodic_accuracy"]) for c in per_n]),
                   "evidence": per_n})
    targets = " and ".join(f"{c['target_ratio']:g}x" for c in compression) or "its target"
    claims.append({"id": "4", "claim": f"dms reaches {targets} compression: tokens seen / tokens kept, pooled "
                                        f"over every layer and KV head, at least {REACHES:g} x the target ratio, "
                                        "on a stream with no forced evictions",
                   "verdict": verdict(bool(compression), [
                       c["forced_evictions"] == 0 and c["compression"] >= REACHES * c["target_ratio"]
                       for c in compression]),
                   "evidence": compression})
    claims.append({"id": "4c", "claim": f"dms frees the memory it compresses: bytes of a dense cache of every token "
                                         f"seen / bytes of KV its pages hold, pooled over layers and KV heads, at "
                                         f"least {FREES:g} x the token compression, at {targets}",
                   "verdict": verdict(bool(compression), [
                       c["byte_compression"] is not None and c["byte_compression"] >= FREES * c["compression"]
                       for c in compression]),
                   "evidence": [{key: c[key] for key in ("target_ratio", "compression", "byte_compression",
                                                         "byte_compression_per_layer", "kv_bytes_held",
                                                         "kv_bytes_dense")} for c in compression]})
    dms_target = max((r["target_ratio"] for r in find("dms")), default=None)
    dms_cells = [{"distractors": f["distractors"], "budget_frames": f["budget_frames"], "target_ratio": dms_target,
                  "keep_share": 1 / dms_target, "fifo_cue_kept": f["cue_kept"], "dms_cue_kept": d["cue_kept"],
                  "dms_cue_entries_kept": d["cue_entries_kept"], "dms_cue_centre_kept": d["cue_centre_kept"],
                  "dms_cue_attention": d["cue_attention"], "dms_uniform_attention": d["uniform_attention"],
                  "dms_compression": d["compression"]}
                 for f in find("fifo") if f["cue_kept"] == 0
                 for d in find("dms", distractors=f["distractors"], budget_frames=f["budget_frames"],
                               target_ratio=dms_target)]
    target_text = f"{dms_target:g}x target" if dms_target is not None else "not run"
    claims.append({"id": "4b", "claim": f"dms ({target_text}) forgets the right things: in every cell where fifo lost "
                                         "the cue, its heads still read the token under the cue in a larger share of "
                                         "(layer, KV head) entries than the 1/target they keep of everything",
                   "verdict": verdict(True, [c["dms_cue_centre_kept"] > c["keep_share"] for c in dms_cells]),
                   "evidence": dms_cells})
    return claims
