"""Decode-step matrix products per weight format: our GEMV's achieved bandwidth against the card's peak.

A decode step reads every weight once, so its floor is the weights' bytes over the memory bandwidth; a
format that halves the bytes halves the floor only if the GEMV still streams at the card's rate. This times
``kernels.linear`` at T = 1 over the matrices of Qwen2.5-1.5B decoder layers (q, k, v, o, the fused gate/up,
down), held in each of fp32, bf16, int8 and int4 (group 64 unless ``--group``), and prints per format:
microseconds per layer, the bytes read (data and scales), GB/s, and that as a share of the peak.
``--layers`` copies of a layer in distinct memory are cycled so the weights do not sit in L2, as in a real
step. Before timing, every matrix's product on the device is checked against
``weight_formats.reference_linear``.

Kernels are timed with CUDA events behind a kernel that holds the stream while the host queues every
launch: Numba's launch overhead (tens of microseconds a call) would otherwise be timed instead of the
GPU. ``--tiny`` runs small shapes through the same code, for the CUDA simulator (NUMBA_ENABLE_CUDASIM=1).

    python bench/bench_gpu_linear.py [--layers 8] [--repeats 20] [--group 64] [--bandwidth-tbs 3.35] [--tiny]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
from numba import cuda

from vla_edge_ros import kernels
from vla_edge_ros.model.backends import cuda_simulated
from vla_edge_ros.numerics.weight_formats import FORMATS, pack, reference_linear

# [out, in] of one Qwen2.5-1.5B decoder layer's products (hidden 1536, 12 heads + 2 KV heads of 128, MLP 8960)
LAYER_1_5B = {"q": (1536, 1536), "k": (256, 1536), "v": (256, 1536), "o": (1536, 1536),
              "gate_up": (17920, 1536), "down": (1536, 8960)}
LAYER_TINY = {"q": (20, 72), "gate_up": (37, 72), "down": (21, 100)}
HOLD_NS = 50_000_000  # long enough for the host to queue every timed launch behind it


@cuda.jit
def _hold(ns):
    """Occupies the stream while the host queues launches behind it (one thread sleeping)."""
    for _ in range(ns // 1_000_000):
        cuda.nanosleep(1_000_000)


def peak_bandwidth_tbs() -> float:
    """The device's peak memory bandwidth from its memory clock and bus width (double data rate)."""
    device = cuda.get_current_device()
    return 2 * device.MEMORY_CLOCK_RATE * 1e3 * device.GLOBAL_MEMORY_BUS_WIDTH / 8 / 1e12


def upload_layers(shapes: dict[str, tuple[int, int]], fmt: str, group: int, layers: int,
                  rng: np.random.Generator) -> tuple[list[dict], int]:
    """`layers` device copies of one layer's matrices packed in `fmt` (distinct memory is what defeats L2,
    and packing once keeps int4's scale search to one layer), each checked; and the bytes of a layer."""
    packed = {name: pack(rng.standard_normal(shape, dtype=np.float32) * np.float32(0.05), fmt, group)
              for name, shape in shapes.items()}
    uploaded = [{name: kernels.to_device_packed(matrix) for name, matrix in packed.items()} for _ in range(layers)]
    for name, matrix in packed.items():
        check_product(uploaded[0][name], matrix, rng)
    return uploaded, sum(matrix.nbytes for matrix in packed.values())


def check_product(weight: kernels.DeviceWeight, matrix, rng: np.random.Generator) -> None:
    """The GEMV's output against the NumPy twin (fp32 sums of up to 8960 products: a loose relative bar)."""
    x = rng.standard_normal((1, matrix.shape[1]), dtype=np.float32)
    out = cuda.device_array((1, matrix.shape[0]), np.float32)
    kernels.linear(cuda.to_device(x), weight, None, out)
    want = reference_linear(x, matrix)
    error = np.abs(out.copy_to_host() - want).max() / np.abs(want).max()
    if not error < 1e-4:
        raise AssertionError(f"{matrix.format} {matrix.shape}: relative error {error:.2e} against reference_linear")


def time_layers(layers: list[dict], names: list[str], inputs: dict[str, object], outputs: dict[str, object],
                repeats: int) -> float:
    """Median GPU seconds per layer for the products `names`, over `repeats` passes over every layer."""
    times = []
    for _ in range(repeats):
        if not cuda_simulated():  # the simulator runs each launch to its end (and cannot sleep)
            _hold[1, 1](HOLD_NS)
        start, end = cuda.event(), cuda.event()
        start.record()
        for layer in layers:
            for name in names:
                kernels.linear(inputs[name], layer[name], None, outputs[name])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / len(layers))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8, help="distinct layers cycled (the weights outgrow L2)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--group", type=int, default=64, help="int4 inputs per scale (32, 64, 128)")
    parser.add_argument("--bandwidth-tbs", type=float, help="peak memory bandwidth (default: read from the device)")
    parser.add_argument("--tiny", action="store_true", help="small shapes, 1 layer, 1 repeat: the simulator's run")
    args = parser.parse_args()
    shapes, layers, repeats = (LAYER_TINY, 1, 1) if args.tiny else (LAYER_1_5B, args.layers, args.repeats)
    simulated = cuda_simulated()  # no bandwidth to read or reach: the figures only show the code ran
    peak = args.bandwidth_tbs or (1.0 if simulated else peak_bandwidth_tbs())
    device = "the CUDA simulator" if simulated else cuda.get_current_device().name
    print(f"device: {device}; peak {peak:.2f} TB/s; {layers} copies of a layer of "
          f"{', '.join(f'{n} {r}x{c}' for n, (r, c) in shapes.items())}")
    rng = np.random.default_rng(0)
    inputs = {name: cuda.to_device(rng.standard_normal((1, cols), dtype=np.float32))
              for name, (_, cols) in shapes.items()}
    outputs = {name: cuda.device_array((1, rows), np.float32) for name, (rows, _) in shapes.items()}
    big = max(shapes, key=lambda name: shapes[name][0] * shapes[name][1])
    print(f"{'format':10}{'MB/layer':>10}{'us/layer':>10}{'GB/s':>9}{'of peak':>9}   "
          f"{big} alone: {'us':>7}{'GB/s':>9}{'of peak':>9}")
    for fmt in FORMATS:
        uploaded, nbytes = upload_layers(shapes, fmt, args.group, layers, rng)
        seconds = time_layers(uploaded, list(shapes), inputs, outputs, repeats)
        big_bytes = uploaded[0][big].nbytes
        big_seconds = time_layers(uploaded, [big], inputs, outputs, repeats)
        rate, big_rate = nbytes / seconds / 1e9, big_bytes / big_seconds / 1e9
        print(f"{fmt:10}{nbytes / 1e6:10.2f}{seconds * 1e6:10.1f}{rate:9.0f}{rate / peak / 10:8.1f}%   "
              f"{'':{len(big) + 7}}{big_seconds * 1e6:7.1f}{big_rate:9.0f}{big_rate / peak / 10:8.1f}%")
        del uploaded


if __name__ == "__main__":
    main()
