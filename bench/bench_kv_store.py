"""Is loading a stored prompt KV block faster than prefilling the prompt again, and what does it cost on disk?

The KV store exists so that a robot that restarts does not pay a long prompt's prefill again. This
measures both ways of getting a prompt into the arena, on the same engine in the same run:

- recompute: ``engine.set_prompt(ids)``, the chunked prefill;
- load: ``store.get(key)`` (read the block file, AES-256-GCM decrypt, unpack) + ``set_prompt(cached=...)``,
  with the prompt's arena slots zeroed first, so the byte-exact check afterwards proves the load wrote them.

Then, for the largest block, AES-GCM decrypt throughput against reading the file (page cache warm: it
was just written), and bytes per token on disk against 2 x layers x kv_heads x head_dim x 4 (fp32 KV).
Models: ``tiny`` and a 4-layer slice of the Qwen2.5-1.5B shape, random weights (seed 0, bf16, as
``vla-edge init-model`` writes them), on the numpy backend or the one ``--backend`` names. An instruction is a
prompt of 16-64 tokens: ``--tokens 16,32,64`` measures re-tasking with a stored instruction. Nothing is downloaded.

    .venv/bin/python bench/bench_kv_store.py [--tokens 1024,4096,16384] [--repeats 3] [--backend numpy|cuda]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cryptography
import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from vla_edge_ros.engine.vla_engine import PREFILL_CHUNK_TOKENS, VlaEngine
from vla_edge_ros.kv_store import BlockStore, model_fingerprint
from vla_edge_ros.kv_store.block_file import HEADER_BYTES, parse_header
from vla_edge_ros.kv_store.engine_blocks import PROMPT_KIND, prompt_key
from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.model.init_model import preset, write_random_model

MODELS = (("tiny", "tiny", None), ("1.5b-shape x4", "qwen2.5-1.5b-shape", 4))


@dataclass
class Row:
    model: str
    tokens: int
    recompute_s: float
    recompute_runs: int
    store_s: float
    load_s: float
    exact: bool
    file_bytes: int
    path: Path


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def median_s(run: Callable[[], object], repeats: int, before: Callable[[], object] = lambda: None) -> float:
    """Median wall time of ``run`` over ``repeats`` calls; ``before`` runs untimed ahead of each."""
    samples = []
    for _ in range(repeats):
        before()
        samples.append(timed(run))
    return statistics.median(samples)


def model_dir(models_dir: Path, preset_name: str, layers: int | None) -> Path:
    """The checkpoint, written deterministically on first use and reused afterwards."""
    out = models_dir / (preset_name + (f"-{layers}l" if layers else ""))
    if not (out / "config.json").exists() or not (out / "model.safetensors").exists():
        write_random_model(out, preset(preset_name, layers), seed=0)
    return out


def bytes_identical(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def load_prompt(engine: VlaEngine, store: BlockStore, key: bytes, ids: np.ndarray) -> None:
    cached = store.get(key)
    if cached is None:  # a miss would silently fall back to a prefill and time the wrong thing
        raise RuntimeError(f"KV block {key.hex()[:16]} did not load: {dict(store.failures)}")
    engine.set_prompt(ids, cached=cached)


def bench_size(name: str, engine: VlaEngine, store: BlockStore, tokens: int, repeats: int, slow_s: float) -> Row:
    """Recompute, store, then load the prompt KV of ``tokens`` random ids; check the load is byte-exact."""
    ids = np.random.default_rng(tokens).integers(0, engine.config.vocab_size, tokens).astype(np.int32)
    samples = [timed(lambda: engine.set_prompt(ids))]
    if samples[0] <= slow_s:  # a prefill slower than this is measured once, to keep the run short
        samples += [timed(lambda: engine.set_prompt(ids)) for _ in range(repeats - 1)]
    reference = engine.prompt_kv()
    key = prompt_key(store, ids)
    stored = timed(lambda: store.put(key, PROMPT_KIND, reference))

    zeros = np.zeros_like(reference["keys"])
    clobber = lambda: engine.backend.write_kv(engine.prompt_slots, zeros, zeros)  # noqa: E731
    load = median_s(lambda: load_prompt(engine, store, key, ids), repeats, before=clobber)
    loaded = engine.prompt_kv()
    exact = all(bytes_identical(loaded[part], reference[part]) for part in ("keys", "values"))
    path = store.path_of(key)
    return Row(name, tokens, statistics.median(samples), len(samples), stored, load, exact, path.stat().st_size, path)


def throughput(path: Path, aes_key: bytes, repeats: int) -> tuple[float, float]:
    """GB/s of reading the block file and of AES-GCM decrypting (and authenticating) its payload."""
    image = path.read_bytes()
    header = parse_header(image, str(path))
    head, body = image[:HEADER_BYTES], image[HEADER_BYTES:]
    aead = AESGCM(aes_key)
    read_s = median_s(path.read_bytes, repeats)
    decrypt_s = median_s(lambda: aead.decrypt(header.nonce, body, head), repeats)
    return len(image) / read_s / 1e9, len(body) / decrypt_s / 1e9


def machine() -> str:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
                platform.processor() or platform.machine())
    aes = "AES-NI" if " aes " in cpuinfo else "no AES-NI flag"
    return (f"{name} ({platform.processor() or platform.machine()}, {aes}), {os.cpu_count()} CPUs; "
            f"Python {platform.python_version()}, numpy {np.__version__}, cryptography {cryptography.__version__}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="1024,4096,16384", help="comma-separated prompt sizes")
    parser.add_argument("--repeats", type=int, default=3, help="loads (and fast recomputes) per size; median")
    parser.add_argument("--slow-s", type=float, default=30.0, help="a recompute slower than this is run once")
    parser.add_argument("--backend", default="numpy", choices=("numpy", "cuda"), help="the engine's backend")
    parser.add_argument("--models-dir", type=Path, default=Path(tempfile.gettempdir()) / "vla_edge_bench_models")
    args = parser.parse_args()
    sizes = sorted(int(t) for t in args.tokens.split(","))
    began = time.perf_counter()
    print(machine())
    print(f"backend {args.backend}, prefill chunk {PREFILL_CHUNK_TOKENS} tokens, encrypted store (AES-256-GCM, random key)")
    rows: list[Row] = []
    speeds: dict[str, tuple[float, float, int]] = {}
    kv_per_token: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="bench_kv_store.") as tmp:
        for name, preset_name, layers in MODELS:
            checkpoint = load_checkpoint(model_dir(args.models_dir, preset_name, layers))
            c = checkpoint.config
            engine = VlaEngine(checkpoint, backend=args.backend,
                               kv_capacity_tokens=sizes[-1] + 1 + c.vision.tokens_per_frame + c.action.dof)
            aes_key = os.urandom(32)
            store = BlockStore(Path(tmp) / preset_name, model_fingerprint(checkpoint), aes_key=aes_key,
                               budget_bytes=16 << 30)
            kv_per_token[name] = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4
            print(f"\n{name}: {c.num_hidden_layers} layers, hidden {c.hidden_size}, {c.num_key_value_heads} KV heads "
                  f"x {c.head_dim}, arena {engine.arena.capacity} tokens")
            if sizes[-1] > c.max_position_embeddings:
                print(f"  note: {sizes[-1]} tokens exceed its max_position_embeddings ({c.max_position_embeddings}); "
                      f"the engine does not enforce it, and random weights make it moot for timing")
            engine.set_prompt(np.arange(64) % c.vocab_size)  # BLAS and first-touch warm-up, untimed
            for tokens in sizes:
                rows.append(bench_size(name, engine, store, tokens, args.repeats, args.slow_s))
                r = rows[-1]
                runs = f"{r.recompute_runs} run" + ("s" if r.recompute_runs > 1 else "")
                print(f"  {tokens:6} tokens: recompute {r.recompute_s:8.3f} s ({runs}), "
                      f"load {r.load_s * 1e3:8.1f} ms, byte-exact {r.exact}", flush=True)
            read_gbs, decrypt_gbs = throughput(rows[-1].path, aes_key, max(args.repeats, 5))
            speeds[name] = (read_gbs, decrypt_gbs, rows[-1].file_bytes)
            del engine, checkpoint

    print("\n1. recompute (set_prompt prefill) vs load (store.get: read + decrypt + unpack, then set_prompt(cached))")
    print(f"   load: median of {args.repeats}; recompute: median of {args.repeats}, or 1 run where the first took "
          f"> {args.slow_s:g} s (runs column)")
    print(f"   {'model':15}{'tokens':>7}{'recompute s':>13}{'runs':>5}{'load ms':>10}{'recomp/load':>13}"
          f"{'put ms':>9}{'byte-exact':>11}")
    for r in rows:
        print(f"   {r.model:15}{r.tokens:7}{r.recompute_s:13.3f}{r.recompute_runs:5}{r.load_s * 1e3:10.1f}"
              f"{r.recompute_s / r.load_s:12.1f}x{r.store_s * 1e3:9.1f}{str(r.exact):>11}")

    print(f"\n2. largest block ({sizes[-1]} tokens): AES-256-GCM decrypt vs reading the file "
          f"(page cache warm: the block was just written; median of {max(args.repeats, 5)})")
    print(f"   {'model':15}{'block MB':>10}{'read GB/s':>11}{'decrypt GB/s':>14}{'decrypt/read':>14}")
    for name, (read_gbs, decrypt_gbs, size) in speeds.items():
        print(f"   {name:15}{size / 1e6:10.1f}{read_gbs:11.2f}{decrypt_gbs:14.2f}{decrypt_gbs / read_gbs:13.2f}x")

    print("\n3. bytes per token on disk vs 2 x layers x kv_heads x head_dim x 4 B (fp32 KV); "
          "ids+pos = int32 token id + position per token,")
    print("   fixed = 108 B block header + 16 B GCM tag + the safetensors header of the payload")
    print(f"   {'model':15}{'tokens':>7}{'file bytes':>13}{'B/token':>10}{'KV formula':>11}{'ids+pos':>8}"
          f"{'fixed B':>9}{'overhead':>10}")
    for r in rows:
        kv = kv_per_token[r.model]
        fixed = r.file_bytes - r.tokens * (kv + 8)
        print(f"   {r.model:15}{r.tokens:7}{r.file_bytes:13,}{r.file_bytes / r.tokens:10.1f}{kv:11}{8:8}{fixed:9}"
              f"{(r.file_bytes / (r.tokens * kv) - 1) * 100:9.2f}%")
    print(f"\ntotal runtime {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
