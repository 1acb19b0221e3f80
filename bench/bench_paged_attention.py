"""Does a dms head's attention cost what it holds, not what it has evicted?

With per-head pages (``model/pages.py``) each (layer, KV head) reads its own entries through its block
table, so a decode step's attention should cost the same whatever number of tokens the heads evicted
before. This builds, for each E in ``--evicted``, an arena in which every (layer, KV head) holds the
same ``--held`` tokens' worth (its own random choice among the H + E tokens seen) and has evicted the
other E, then times one decode token's forward (the whole decoder, numpy backend, BLAS on one thread),
median of ``--repeats`` after one warm-up. Times are the process's CPU time (``time.process_time``), so
that other work on a shared machine does not count; the machine's load is printed with the figures.

Beside it, the same step's attention as it ran before pages, on slots with a mask per KV head: every
head scans the span of slots some head still holds (the union of what the heads keep) under a mask.
That column is a reference model timed here on arrays of the span's size (``ops.gqa_attention`` with a
per-head bias), not the old code, which is gone. The ratio columns divide by the E = 0 row of the same
column. Model: the ``tiny`` preset (4 layers x 2 KV heads x head_dim 64), random weights, seed 0.

    .venv/bin/python bench/bench_paged_attention.py [--held 256] [--evicted 0,1024,4096,16384] [--repeats 30]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

import numpy as np
from threadpoolctl import threadpool_limits

from vla_edge_ros.engine.vla_engine import VlaEngine
from vla_edge_ros.memory import make_policy
from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.model.init_model import preset, write_random_model
from vla_edge_ros.numerics import ops

CHUNK = 256  # tokens per prefill while the arena fills


def fill(engine: VlaEngine, held: int, evicted: int, rng: np.random.Generator) -> None:
    """Stream ``held + evicted`` tokens into the arena; every (layer, KV head) keeps ``held`` of them,
    its own random choice, and evicts the rest (a slot is freed when no head holds it)."""
    arena, backend, c = engine.arena, engine.backend, engine.config
    seen = held + evicted
    position = 0
    for start in range(0, seen, CHUNK):
        count = min(CHUNK, seen - start)
        slots = arena.allocate(count)
        embeddings = rng.standard_normal((count, c.hidden_size)).astype(np.float32)
        backend.forward(np.arange(position, position + count, dtype=np.int32), slots, embeddings=embeddings)
        position += count
    slots = np.flatnonzero(arena.valid).astype(np.int32)
    keep = np.zeros((c.num_hidden_layers, c.num_key_value_heads, slots.size), dtype=bool)
    for layer in range(c.num_hidden_layers):
        for head in range(c.num_key_value_heads):
            keep[layer, head, rng.choice(slots.size, size=held, replace=False)] = True
    arena.hide(slots, ~keep)


def decode_s(engine: VlaEngine, repeats: int, rng: np.random.Generator) -> float:
    """Median CPU seconds of one decode token's forward; the token leaves again, so every repeat sees the same arena."""
    arena, c = engine.arena, engine.config
    times = []
    for _ in range(repeats + 1):
        slot = arena.allocate(1)
        embedding = rng.standard_normal((1, c.hidden_size)).astype(np.float32)
        position = np.array([arena.next_position()], dtype=np.int32)
        start = time.process_time()
        engine.backend.forward(position, slot, embeddings=embedding)
        times.append(time.process_time() - start)
        arena.release(slot)
    return statistics.median(times[1:])  # the first warms up


def masked_span_s(engine: VlaEngine, repeats: int, rng: np.random.Generator) -> tuple[float, int]:
    """Median CPU seconds of the attention alone, all layers, as a slot-masked read of the span would cost it, and
    that span (slots up to the last held one)."""
    arena, c = engine.arena, engine.config
    span = int(np.flatnonzero(arena.valid).max()) + 2  # the held slots and the decode token's
    k = rng.standard_normal((c.num_key_value_heads, span, c.head_dim)).astype(np.float32)
    v = rng.standard_normal((c.num_key_value_heads, span, c.head_dim)).astype(np.float32)
    q = rng.standard_normal((1, c.num_attention_heads, c.head_dim)).astype(np.float32)
    bias = ops.attention_bias(rng.random((c.num_key_value_heads, 1, span)) < 0.5)
    times = []
    for _ in range(repeats + 1):
        start = time.process_time()
        for _layer in range(c.num_hidden_layers):
            ops.gqa_attention(q, k, v, bias, 1.0 / np.sqrt(c.head_dim))
        times.append(time.process_time() - start)
    return statistics.median(times[1:]), span


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held", type=int, default=256, help="tokens each (layer, KV head) holds")
    parser.add_argument("--evicted", default="0,1024,4096,16384", help="tokens each head evicted, comma-separated")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--page-tokens", type=int, default=16)
    args = parser.parse_args()
    evicted = [int(e) for e in args.evicted.split(",")]
    print(f"{platform.node()}: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; "
          f"held {args.held} per head, pages of {args.page_tokens}, {args.repeats} repeats")
    with tempfile.TemporaryDirectory() as tmp, threadpool_limits(limits=1, user_api="blas"):
        checkpoint = load_checkpoint(write_random_model(tmp, preset("tiny"), seed=0))
        rows = []
        for e in evicted:
            rng = np.random.default_rng(e)
            engine = VlaEngine(checkpoint, backend="numpy", kv_capacity_tokens=args.held + e + 2,
                               policy=make_policy("dms"), kv_page_tokens=args.page_tokens)
            fill(engine, args.held, e, rng)
            lengths = engine.arena.pages.lengths
            paged = decode_s(engine, args.repeats, rng)
            masked, span = masked_span_s(engine, args.repeats, rng)
            rows.append((e, int(lengths.min()), int(lengths.max()), engine.arena.pages.pages_in_use(),
                         engine.arena.used, span, paged, masked))
    base_paged, base_masked = rows[0][6], rows[0][7]
    print(f"{'evicted':>8} {'held/head':>10} {'pages':>6} {'slots held':>10} {'span':>6} "
          f"{'paged decode ms':>15} {'ratio':>6} {'masked attn ms':>14} {'ratio':>6}  (CPU ms)")
    for e, low, high, pages, used, span, paged, masked in rows:
        held = f"{low}" if low == high else f"{low}..{high}"
        print(f"{e:>8} {held:>10} {pages:>6} {used:>10} {span:>6} {paged * 1e3:>15.3f} {paged / base_paged:>6.2f} "
              f"{masked * 1e3:>14.3f} {masked / base_masked:>6.2f}")


if __name__ == "__main__":
    main()
