"""Decode speed of the compiled CPU kernels against the memory floor, on one Qwen2.5-1.5B decoder layer's shapes.

A layer's projections are [2048, 1536] (q, k, v fused), [1536, 1536] (o), [17920, 1536] (gate, up fused) and
[1536, 8960] (down). Each format gets ``--layers`` distinct copies (random values in the exact layout, since
speed does not depend on them), more bytes than the caches hold, and one token runs through all of them;
ms per token is per layer. The floor is a compiled streaming read of the same buffers (summed as uint64
words, each split over the same threads), timed alternately with the kernels in the same process.
A format measured after others in one process came out up to 30% slower against the same floor (int8,
one thread), so one format a run (``--formats``) gives the steadier figure. The columns: MB read a token
(data and scales), median and best ms a token, the floor's best ms, and best over floor.

    .venv/bin/python bench/bench_cpu_linear.py [--threads 1 2] [--tokens 1] [--layers 4] [--formats int8]
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np
from numba import njit, prange
from threadpoolctl import threadpool_limits

from vla_edge_ros.cpu_kernels import linear, set_threads
from vla_edge_ros.numerics.bf16 import bf16_bits
from vla_edge_ros.numerics.weight_formats import FORMATS, PackedMatrix

SHAPES = ((2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960))


@njit(nogil=True, cache=True)
def _sum_words(words: np.ndarray) -> np.uint64:
    total = np.uint64(0)
    for i in range(words.shape[0]):
        total += words[i]
    return total


@njit(nogil=True, cache=True, parallel=True)
def stream(words: np.ndarray, parts: int) -> np.uint64:
    """Read every word once, ``parts`` contiguous slices in parallel: the bytes' floor."""
    per = -(-words.shape[0] // parts)
    sums = np.zeros(parts, dtype=np.uint64)
    for p in prange(parts):
        sums[p] = _sum_words(words[p * per:min(words.shape[0], (p + 1) * per)])
    return sums.sum()


def random_matrix(fmt: str, shape: tuple[int, int], group: int, rng: np.random.Generator) -> PackedMatrix:
    rows, width = shape
    if fmt == "float32":
        return PackedMatrix(fmt, shape, rng.standard_normal(shape, dtype=np.float32))
    if fmt == "bfloat16":
        return PackedMatrix(fmt, shape, bf16_bits(rng.standard_normal(shape, dtype=np.float32)))
    if fmt == "int8":
        return PackedMatrix(fmt, shape, rng.integers(-127, 128, shape, dtype=np.int8),
                            rng.random(rows, dtype=np.float32))
    groups = -(-width // group)
    return PackedMatrix(fmt, shape, rng.integers(0, 256, (rows, groups * group // 2), dtype=np.uint8),
                        rng.random((rows, groups), dtype=np.float32), group)


def timings(run, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return times


def measure(fmt: str, args: argparse.Namespace, rng: np.random.Generator) -> None:
    """Print one row per variant and thread count for format ``fmt``."""
    xs = {width: rng.standard_normal((args.tokens, width), dtype=np.float32) for _, width in SHAPES}
    outs = [np.empty((args.tokens, rows), dtype=np.float32) for rows, _ in SHAPES]
    layers = [[random_matrix(fmt, shape, args.group, rng) for shape in SHAPES] for _ in range(args.layers)]
    matrices = [(m, xs[m.shape[1]], out) for layer in layers for m, out in zip(layer, outs)]
    nbytes = sum(m.nbytes for m, _, _ in matrices)
    buffers = [a.reshape(-1).view(np.uint64) for m, _, _ in matrices for a in (m.data, m.scales) if a is not None]
    variants = [(fmt, lambda: [linear(x, m, out=out) for m, x, out in matrices])]
    if fmt == "float32":
        variants.append(("float32 (NumPy)", lambda: [np.matmul(x, m.data.T, out=out) for m, x, out in matrices]))
    per_layer = 1e3 / args.layers
    for threads in args.threads:
        set_threads(threads)
        numba.set_num_threads(threads)

        def floor_run() -> None:
            for words in buffers:
                stream(words, threads)

        with threadpool_limits(threads, user_api="blas"):
            for name, run in variants:
                run()
                floor_run()
                runs, floors = [], []
                for _ in range(args.repeats):  # alternate, so load from elsewhere hits both alike
                    runs += timings(run, 1)
                    floors += timings(floor_run, 1)
                best, floor = min(runs) * per_layer, min(floors) * per_layer
                print(f"{name:<16}{threads:>8}{nbytes / args.layers / 1e6:>10.1f}{np.median(runs) * per_layer:>10.2f}"
                      f"{best:>8.2f}{floor:>10.2f}{best / floor:>7.2f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="kernel (and BLAS) threads")
    parser.add_argument("--tokens", type=int, default=1, help="tokens a product (T)")
    parser.add_argument("--layers", type=int, default=4, help="distinct copies of the layer's matrices")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--group", type=int, default=64, help="int4 group")
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'format':<16}{'threads':>8}{'MB/token':>10}{'ms/token':>10}{'best':>8}{'floor ms':>10}{'ratio':>7}")
    for fmt in args.formats.split(","):
        measure(fmt, args, rng)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
