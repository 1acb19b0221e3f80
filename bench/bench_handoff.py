"""What handing a 640x480 frame to the reasoning thread costs, next to the memcpy it cannot avoid.

One thread, interleaved: each iteration times a FrameBuffer write + read_latest and a plain
np.copyto of the same bytes into a preallocated array, so both see the same machine state.
The handoff rotates through three slots (2.7 MiB) where the memcpy reuses one destination, so
part of any gap is cache, not bookkeeping.

    .venv/bin/python bench/bench_handoff.py [--iterations N]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from vla_edge_ros.runtime.frame_buffer import FrameBuffer

HEIGHT, WIDTH = 480, 640


def percentiles_us(samples_ns: list[int]) -> tuple[float, float]:
    """Median and p99, in microseconds."""
    median, p99 = np.percentile(np.asarray(samples_ns, dtype=np.float64), [50, 99])
    return median / 1e3, p99 / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)
    destination = np.empty_like(image)
    buf = FrameBuffer(HEIGHT, WIDTH)
    clock = time.perf_counter_ns

    handoff: list[int] = []
    memcpy: list[int] = []
    for i in range(args.warmup + args.iterations):
        t0 = clock()
        buf.write(image, stamp_ns=i, receive_ns=i)
        frame = buf.read_latest()
        t1 = clock()
        np.copyto(destination, image)
        t2 = clock()
        assert frame is not None and frame.seq == i
        if i >= args.warmup:
            handoff.append(t1 - t0)
            memcpy.append(t2 - t1)

    h_med, h_p99 = percentiles_us(handoff)
    m_med, m_p99 = percentiles_us(memcpy)
    print(f"{HEIGHT}x{WIDTH}x3 uint8 ({image.nbytes:,} B), {args.iterations} iterations")
    print(f"{'':26}{'median us':>10}{'p99 us':>10}")
    print(f"{'handoff (write+read)':26}{h_med:10.1f}{h_p99:10.1f}")
    print(f"{'memcpy (np.copyto)':26}{m_med:10.1f}{m_p99:10.1f}")
    print(f"{'ratio handoff / memcpy':26}{h_med / m_med:10.2f}{h_p99 / m_p99:10.2f}")
    print(f"overhead beyond the copy: {h_med - m_med:.1f} us median")


if __name__ == "__main__":
    main()
