"""Narrow weights on CPU: ours at every width against the byte floor, HF eager and CTranslate2, at 1 and 2 threads.

Everything is measured in one run, in interleaved rounds (each case a short block in turn, A B C A B C ...,
so that drift and other users' load hit all cases alike); figures are medians. Per thread count:

- decode, layers only: one token through the embedding lookup, the decoder layers, the final norm and a
  256-row head (the bins an action step reads), at a ``--context`` token context (512); ms a token.
- decode, full head: the same with the full-vocabulary lm_head (151,936 rows on the 1.5B shape): text.
- prefill of a frame: one frame's ``tokens_per_frame`` input embeddings at that context (no head).
- the shipped model's frame cycle (models/sim): ``VlaEngine.step`` on a camera frame (encode, prefill,
  action) at steady state of a 512-token arena, against HF fed the same frame encoder's output at the same
  context, with the same action head; the encode alone is timed too, so the ratio is also given without it.

Engines: ours (numpy backend, ``reasoning.weights`` float32 / bfloat16 / int8 / int4, int4 group 64, whose
embedding and lm_head stay int8); HF transformers' Qwen2 in fp32 with eager attention (bench_model's
``Reference``); CTranslate2 float32 and int8, converted from the same checkpoint by ``TransformersConverter``
(what ``ct2-transformers-converter --quantization float32|int8`` runs, called in-process to skip four
start-ups of transformers). CTranslate2 is a benchmark-only dependency (``pip install ctranslate2``); without
it its columns are left out. Ours and HF roll their cache back after each measured call, so every call runs
at the same context.

- The 256-row head in HF is bench_model's: the last hidden state times the bin rows of lm_head. CTranslate2
  always applies its whole lm_head, so its layers-only figure comes from a copy of the checkpoint whose
  vocabulary is cut to the 256 bin rows (embedding and lm_head rows ``vocab - 256:``, ``vocab_size: 256``):
  the same layers, the same head rows.
- CTranslate2's decode step: ``Generator.generate_batch`` with the context as ``static_prompt`` (cached after
  the first call, so no call re-prefills it), one prompt token and a ``callback``, which the generating thread
  calls as each token is picked; the time between two calls is one decode step (embedding, layers, head,
  greedy pick) at context + 1..n, a few tokens a call. (``generate_tokens``' yields come through a queue from
  that thread and bunch up whenever the reader lags; ``forward_batch`` keeps no cache between calls, so it
  would time a whole-context prefill instead.) CTranslate2 takes token ids only, no input embeddings, so
  it has no frame-prefill or frame-cycle figure.

Weight bytes a token: the held matrices' ``PackedMatrix.nbytes`` that a step reads (every layer matrix,
one embedding row, the head's rows); HF fp32 and CTranslate2 float32 read ours-float32's bytes, CTranslate2
int8 ours-int8's (the same int8 rows with one fp32 scale a row: its model.bin is that size). The byte floor
is one compiled streaming read (bench_cpu_linear's ``stream``) of that many bytes of one large buffer at that
thread count, the best of its samples (the least time those bytes can take); its cases run in the same rounds
as the engines, and each engine's ``x floor`` (its median over that best) is against the floor of its bytes.

Peak resident memory: a fresh worker process per format (``WORKER``) loads the model into a ``VlaEngine`` and
runs a few frame steps (frame prefill and the bins decode); it reports its own VmHWM, the peak of its
address space since exec (ru_maxrss would also count the parent's size copied in at spawn), with the
resident size at the end beside it and how much of that is file-backed (the memory-mapped checkpoint).

    .venv/bin/python bench/bench_weights.py [--model DIR] [--threads 1,2] [--rounds 5] [--context 512]
                                            [--json FILE] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np
import torch
from bench_cpu_linear import stream
from bench_model import Ours, Reference
from threadpoolctl import threadpool_limits

from vla_edge_ros.cpu_kernels import set_threads
from vla_edge_ros.engine.vla_engine import VlaEngine
from vla_edge_ros.model.arena import KVArena
from vla_edge_ros.model.backends import make_backend
from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.model.config import NUM_ACTION_BINS
from vla_edge_ros.model.init_model import preset, write_random_model
from vla_edge_ros.model.safetensors_io import StoredTensor, write_safetensors
from vla_edge_ros.model.vision import FrameEncoder
from vla_edge_ros.numerics.weight_formats import DEFAULT_INT4_GROUP, FORMATS, take_rows
from vla_edge_ros.worlds.synthetic import SyntheticCamera

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "models" / "sim"
CT2_FORMATS = ("float32", "int8")
REPEATS = 5  # measured calls a block (CTranslate2: decode steps a call)
SETTLE_S = 0.25  # pause before each block: the last library's OpenMP workers stop spinning on the cores
TINY_CAPACITY = 512  # the shipped config's kv_capacity_tokens
TINY_PROMPT = 32
WORKER_STEPS = 3
WORKER = """\
import json, sys
from pathlib import Path
from vla_edge_ros.engine.vla_engine import VlaEngine
from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.worlds.synthetic import SyntheticCamera
model_dir, fmt, group, capacity, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
engine = VlaEngine(load_checkpoint(model_dir, weights=fmt, weights_group=group), backend="numpy",
                   kv_capacity_tokens=capacity)
camera = SyntheticCamera(seed=0)
for _ in range(steps):
    engine.step(camera.frame())
status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
print(json.dumps({key: int(status[key].split()[0]) for key in ("VmHWM", "VmRSS", "RssFile")}))
"""
"""A worker holding the model: only what a robot's process imports (no torch), so its memory is the model's."""


@dataclass(eq=False)
class Case:
    """One measured thing: ``run(n)`` makes n measurements and returns each one's seconds."""

    workload: str  # a key of WORKLOADS
    engine: str
    run: Callable[[int], list[float]]
    best: bool = False  # a floor: the best of its samples, the least time the bytes can take; else the median


ENCODE = "encode alone"  # the frame encoding both cycles share (the same NumPy code)
WORKLOADS = {"layers": "decode, layers only (256-row head)", "full": "decode, full-vocabulary head",
             "prefill": "prefill of a frame", "cycle": "frame cycle, shipped model (models/sim)"}


def timed(call: Callable[[], object]) -> Callable[[int], list[float]]:
    """``call`` as a Case's ``run``: n calls, each timed on its own."""
    def run(count: int) -> list[float]:
        times = []
        for _ in range(count):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
        return times
    return run


class OursAtContext(Ours):
    """bench_model's ``Ours`` over an arena sized for ``context`` tokens plus one frame (its own arena is for
    its fixed prompt and frames); a checkpoint loaded with a ``weights`` format holds its matrices in it."""

    def __init__(self, checkpoint, context_ids: np.ndarray) -> None:  # noqa: D107 - bench_model's fields
        c = checkpoint.config
        spare = c.vision.tokens_per_frame + 1
        self.backend = make_backend("numpy", checkpoint, KVArena(len(context_ids) + spare))
        self.bins = slice(c.vocab_size - NUM_ACTION_BINS, c.vocab_size)
        self.first_bin = c.vocab_size - NUM_ACTION_BINS
        self._append(token_ids=context_ids)
        self.base_used = self.backend.arena.used

    def decode_bins(self, bin_index: int) -> int:
        """A bin token through the layers and the 256-row head: one action decode step."""
        bin_index = self.backend.greedy(self._append(token_ids=np.array([self.first_bin + bin_index])), self.bins)
        self._rollback()
        return bin_index

    def prefill(self, frame: np.ndarray) -> None:
        self._append(embeddings=frame)
        self._rollback()

    def bytes_a_token(self, rows: slice) -> int:
        """The held matrices' bytes one decode step reads: every layer matrix, one embedding row, ``rows`` of
        the head."""
        backend = self.backend
        layers = sum(m.nbytes for layer in backend.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down))
        return layers + backend.embed.nbytes // backend.embed.shape[0] + take_rows(backend.lm_head, rows).nbytes


class HfAtContext(Reference):
    """bench_model's ``Reference`` (transformers' Qwen2, fp32, a DynamicCache cropped back after each call)
    with eager attention, plus the layers-only step and a frame's prefill."""

    def __init__(self, model_dir: Path, prompt: np.ndarray, context: list[np.ndarray]) -> None:
        super().__init__(model_dir, prompt, context)
        self.model.set_attn_implementation("eager")

    def _crop(self) -> None:
        self.cache.crop(self.base_len - self.cache.get_seq_length())

    def decode_bins(self, bin_index: int) -> int:
        with torch.no_grad():
            hidden = self._run(input_ids=torch.tensor([[self.first_bin + bin_index]]))
            bin_index = int(torch.argmax(self.bin_weight @ hidden))
        self._crop()
        return bin_index

    def prefill(self, frame: np.ndarray) -> None:
        with torch.no_grad():
            self._run(inputs_embeds=torch.from_numpy(frame[None]))
        self._crop()

    def linear_action(self, frame: np.ndarray, head) -> np.ndarray:
        """A linear action head's action for a frame's embeddings: prefill, then ``head`` on the last hidden."""
        with torch.no_grad():
            hidden = self._run(inputs_embeds=torch.from_numpy(frame[None])).numpy()
        self._crop()
        return head.from_hidden(hidden)


class Ct2Decoder:
    """A CTranslate2 generator holding the context as a cached static prompt; ``run(n)`` times n decode steps."""

    def __init__(self, model_dir: Path, compute_type: str, threads: int, context_ids: np.ndarray) -> None:
        import ctranslate2

        self.generator = ctranslate2.Generator(str(model_dir), device="cpu", compute_type=compute_type,
                                               intra_threads=threads, inter_threads=1)
        vocabulary = json.loads((model_dir / "vocabulary.json").read_text())
        self.context = [vocabulary[i] for i in context_ids]
        self.prompt = [vocabulary[7]]
        self.run(1)  # prefills and caches the static prompt

    def run(self, count: int) -> list[float]:
        stamps: list[float] = []

        def stamp(_step) -> None:  # called by the generating thread as each token is picked (None: go on)
            stamps.append(time.perf_counter())

        self.generator.generate_batch([self.prompt], max_length=count + 1, min_length=count + 1, end_token=[],
                                      static_prompt=self.context, callback=stamp)
        return np.diff(stamps).tolist()


def ctranslate2_missing() -> str:
    """Why CTranslate2's columns are left out ("" when it is installed)."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return "CTranslate2 is not installed, its columns are left out: pip install ctranslate2"
    return ""


def decoder_copy(model_dir: Path, out: Path, rows: slice = slice(None)) -> Path:
    """A plain HF Qwen2 checkpoint of the decoder alone (no vision.*, action_head.*, aura.*, no vla config),
    with the vocabulary cut to ``rows`` (embedding and an untied lm_head), bits unchanged: what CTranslate2's
    converter reads, and with the 256 bin rows the same layers and head rows as the full model's bins step."""
    checkpoint = load_checkpoint(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config.pop("vla", None)
    tensors = {}
    for name, tensor in checkpoint.tensors.items():
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            tensor = StoredTensor(tensor.dtype, np.ascontiguousarray(tensor.array[rows]))
            config["vocab_size"] = tensor.shape[0]
        if name.startswith(("model.", "lm_head.")):
            tensors[name] = tensor
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_safetensors(out / "model.safetensors", tensors)
    return out


def convert_ct2(hf_dir: Path, out: Path, quantization: str) -> Path:
    from ctranslate2.converters import TransformersConverter

    TransformersConverter(str(hf_dir)).convert(str(out), quantization=quantization)
    return out


class Floor:
    """The byte floor: one compiled streaming read of the first n bytes of one buffer, larger than any cache."""

    def __init__(self, largest: int) -> None:
        self.words = np.ones(-(-largest // 8), dtype=np.uint64)  # written, so every page is really there

    def case(self, nbytes: int, threads: int) -> Callable[[int], list[float]]:
        words = self.words[:nbytes // 8]
        return timed(lambda: stream(words, threads))


def worker_memory(model_dir: Path, fmt: str, capacity: int) -> dict[str, int]:
    """Peak and final resident KiB of a fresh worker holding the model in ``fmt`` (see ``WORKER``)."""
    done = subprocess.run([sys.executable, "-c", WORKER, str(model_dir), fmt, str(DEFAULT_INT4_GROUP),
                           str(capacity), str(WORKER_STEPS)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the {fmt} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@dataclass
class Setup:
    """What every thread count measures: our backends and HF at the context, the frame, the shipped model's
    engines and HF twin, and the CTranslate2 models on disk (generators are made per thread count)."""

    ours: dict[str, OursAtContext]
    hf: HfAtContext
    frame: np.ndarray
    tiny: dict[str, VlaEngine]
    tiny_hf: HfAtContext
    tiny_image: np.ndarray
    ct2_dirs: dict[tuple[str, str], Path]  # (format, "layers" | "full") -> converted model
    context_ids: np.ndarray
    bin_context_ids: np.ndarray


def set_up(model_dir: Path, work: Path, context: int, with_ct2: bool) -> Setup:
    """Load and prefill every engine once (the context's prefills dominate), converting for CTranslate2."""
    checkpoint = load_checkpoint(model_dir)
    c = checkpoint.config
    rng = np.random.default_rng(0)
    context_ids = rng.integers(0, c.vocab_size - NUM_ACTION_BINS, context).astype(np.int32)
    bin_context_ids = rng.integers(0, NUM_ACTION_BINS, context).astype(np.int32)
    frame = FrameEncoder.from_checkpoint(checkpoint).encode(SyntheticCamera(seed=1).frame())
    ours = {fmt: OursAtContext(load_checkpoint(model_dir, weights=fmt, weights_group=DEFAULT_INT4_GROUP), context_ids)
            for fmt in FORMATS}
    full = decoder_copy(model_dir, work / "hf_full")
    hf = HfAtContext(full, context_ids, [])
    ct2_dirs = {}
    if with_ct2:
        bins = decoder_copy(model_dir, work / "hf_bins", slice(c.vocab_size - NUM_ACTION_BINS, c.vocab_size))
        for fmt in CT2_FORMATS:
            ct2_dirs[fmt, "full"] = convert_ct2(full, work / f"ct2_{fmt}_full", fmt)
            ct2_dirs[fmt, "layers"] = convert_ct2(bins, work / f"ct2_{fmt}_bins", fmt)
    tiny, tiny_hf, tiny_image = shipped_engines(work, rng)
    return Setup(ours, hf, frame, tiny, tiny_hf, tiny_image, ct2_dirs, context_ids, bin_context_ids)


def shipped_engines(work: Path, rng: np.random.Generator) -> tuple[dict[str, VlaEngine], HfAtContext, np.ndarray]:
    """The shipped model at every format, each run to a full arena (FIFO evicting a frame a step), and HF
    holding the same prompt and as many frames."""
    prompt = rng.integers(0, 256, TINY_PROMPT).astype(np.int32)
    camera = SyntheticCamera(seed=2)
    engines = {}
    for fmt in FORMATS:
        engine = VlaEngine(load_checkpoint(SHIPPED, weights=fmt, weights_group=DEFAULT_INT4_GROUP),
                           backend="numpy", kv_capacity_tokens=TINY_CAPACITY)
        engine.set_prompt(prompt)
        for _ in range(TINY_CAPACITY // engine.observation_tokens + 2):
            engine.step(camera.frame())
        engines[fmt] = engine
    first = engines[FORMATS[0]]
    frames = (first.arena.used - TINY_PROMPT) // first.observation_tokens
    hf = HfAtContext(decoder_copy(SHIPPED, work / "shipped_decoder"), prompt,
                     [first.encoder.encode(camera.frame()) for _ in range(frames)])
    return engines, hf, camera.frame()


def shipped_cycle(setup: Setup) -> Callable[[], object]:
    """HF's frame cycle on the shipped model: the same frame encoder, prefill, and the model's action head."""
    engine = setup.tiny[FORMATS[0]]
    if engine.config.action.head == "linear":
        return lambda: setup.tiny_hf.linear_action(engine.encoder.encode(setup.tiny_image), engine.head)
    return lambda: setup.tiny_hf.cycle(engine.encoder.encode(setup.tiny_image), engine.config.action.dof)


def decode_call(engine: OursAtContext | HfAtContext, workload: str) -> Callable[[], int]:
    """One decode step of ``engine``: a bin token through the 256-row head, or a token through the whole one."""
    return (lambda: engine.decode_bins(7)) if workload == "layers" else (lambda: engine.decode(7))


def cases_for(setup: Setup, threads: int, floor: Floor, ct2: dict[tuple[str, str], Ct2Decoder],
              nbytes: dict[str, dict[str, int]]) -> list[Case]:
    """Every case at ``threads``: per workload, ours at each format, HF, CTranslate2 and each byte floor."""
    cases = []
    for workload in ("layers", "full"):
        cases += [Case(workload, f"ours {fmt}", timed(decode_call(ours, workload))) for fmt, ours in setup.ours.items()]
        cases.append(Case(workload, "HF eager", timed(decode_call(setup.hf, workload))))
        cases += [Case(workload, f"CT2 {fmt}", ct2[fmt, workload].run) for fmt in CT2_FORMATS if (fmt, workload) in ct2]
        cases += [Case(workload, f"floor {fmt}", floor.case(nbytes[workload][fmt], threads), best=True)
                  for fmt in FORMATS]
    cases += [Case("prefill", f"ours {fmt}", timed(lambda o=ours: o.prefill(setup.frame)))
              for fmt, ours in setup.ours.items()]
    cases.append(Case("prefill", "HF eager", timed(lambda: setup.hf.prefill(setup.frame))))
    cases += [Case("cycle", f"ours {fmt}", timed(lambda e=engine: e.step(setup.tiny_image)))
              for fmt, engine in setup.tiny.items()]
    cases.append(Case("cycle", "HF eager", timed(shipped_cycle(setup))))
    encoder = setup.tiny[FORMATS[0]].encoder
    cases.append(Case("cycle", ENCODE, timed(lambda: encoder.encode(setup.tiny_image))))
    return cases


def measure(cases: list[Case], rounds: int, repeats: int, settle_s: float) -> dict[str, dict[str, float]]:
    """Each case's ms (median, a floor's best) over ``rounds`` interleaved rounds of ``repeats`` measurements;
    each block starts with one unmeasured call, which takes the previous block's cache misses and spinning
    threads."""
    samples: dict[Case, list[float]] = {case: [] for case in cases}
    for _ in range(rounds):
        for case in cases:
            time.sleep(settle_s)
            case.run(1)
            samples[case] += case.run(repeats)
    ms: dict[str, dict[str, float]] = {}
    for case, times in samples.items():
        ms.setdefault(case.workload, {})[case.engine] = (min(times) if case.best else statistics.median(times)) * 1e3
    return ms


def at_threads(setup: Setup, threads: int, floor: Floor, nbytes: dict[str, dict[str, int]],
               args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Every case's median ms with ``threads`` threads for our kernels and the floor (Numba), BLAS, torch and
    CTranslate2 (whose generators take their thread count when made, so they are made here)."""
    set_threads(threads)
    numba.set_num_threads(threads)
    torch.set_num_threads(threads)
    with threadpool_limits(threads, user_api="blas"):
        ct2 = {(fmt, workload): Ct2Decoder(path, fmt, threads,
                                           setup.bin_context_ids if workload == "layers" else setup.context_ids)
               for (fmt, workload), path in setup.ct2_dirs.items()}
        return measure(cases_for(setup, threads, floor, ct2, nbytes), args.rounds, args.repeats, args.settle)


def floor_of(engine: str) -> str:
    """The format whose bytes ``engine`` reads: HF eager reads fp32, CTranslate2 and ours their format."""
    return "float32" if engine == "HF eager" else engine.split()[1]


def decode_table(workload: str, results: dict[int, dict], nbytes: dict[str, int]) -> list[str]:
    """A decode workload's rows: MB a token, and at each thread count median ms and x its byte floor."""
    threads = list(results)
    lines = [f"{'':18}{'MB/token':>10}" + "".join(f"{f'{n} thr ms':>12}{'x floor':>9}" for n in threads)]
    for engine in results[threads[0]][workload]:
        fmt = floor_of(engine)
        row = f"{engine:18}{nbytes[fmt] / 1e6:>10.1f}"
        for n in threads:
            ms = results[n][workload][engine]
            row += f"{ms:>12.2f}{ms / results[n][workload][f'floor {fmt}']:>9.2f}"
        lines.append(row)
    return lines


def versus_hf_table(workload: str, results: dict[int, dict]) -> list[str]:
    """A prefill or cycle workload's rows: at each thread count median ms and HF's ms over this one's."""
    threads = list(results)
    lines = [f"{'':18}" + "".join(f"{f'{n} thr ms':>12}{'HF / this':>10}" for n in threads)]
    for engine in results[threads[0]][workload]:
        row = f"{engine:18}"
        for n in threads:
            ms = results[n][workload]
            ratio = "" if engine == ENCODE else f"{ms['HF eager'] / ms[engine]:.2f}"
            row += f"{ms[engine]:>12.2f}{ratio:>10}"
        lines.append(row)
    return lines


def targets(results: dict[int, dict], memory: dict[str, dict[str, int]], shipped_format: str) -> list[dict]:
    """The issue's targets (and int4, reported the same way without one), each with its measured ratio."""
    found = []

    def add(what: str, ratio: float, bound: float | None, at_most: bool) -> None:
        met = None if bound is None else (ratio <= bound if at_most else ratio >= bound)
        found.append({"target": what, "ratio": round(ratio, 3), "bound": bound, "at_most": at_most, "met": met})

    for n, r in results.items():
        layers = r["layers"]
        for fmt, bound in (("bfloat16", 1.3), ("int8", 1.5), ("int4", None)):
            add(f"{n} thr: ours {fmt} layers-only decode / {fmt} floor", layers[f"ours {fmt}"] / layers[f"floor {fmt}"],
                bound, True)
        if "CT2 int8" in layers:
            for fmt, bound in (("int8", 1.5), ("int4", None)):
                add(f"{n} thr: CT2 int8 / ours {fmt}, layers-only decode (speed-up)",
                    layers["CT2 int8"] / layers[f"ours {fmt}"], bound, False)
        cycle, encode = r["cycle"], r["cycle"][ENCODE]
        add(f"{n} thr: HF eager / ours {shipped_format} (as shipped), frame cycle (speed-up)",
            cycle["HF eager"] / cycle[f"ours {shipped_format}"], 3.0, False)
        add(f"{n} thr: the same without the frame encode both share",
            (cycle["HF eager"] - encode) / (cycle[f"ours {shipped_format}"] - encode), None, False)
    add("peak resident memory, worker holding the model: float32 / int8",
        memory["float32"]["VmHWM"] / memory["int8"]["VmHWM"], 2.0, False)
    add("the same, resident at the end (after load and steps)",
        memory["float32"]["VmRSS"] / memory["int8"]["VmRSS"], None, False)
    return found


def target_line(target: dict) -> str:
    if target["bound"] is None:
        verdict = "(reported, no target)"
    else:
        verdict = f"{'<=' if target['at_most'] else '>='} {target['bound']}: {'met' if target['met'] else 'NOT MET'}"
    return f"  {target['target']:74} {target['ratio']:6.2f}x  {verdict}"


def report(model: str, context: int, results: dict[int, dict], nbytes: dict[str, dict[str, int]],
           memory: dict[str, dict[str, int]], found: list[dict], loads: dict[int, tuple[float, float]]) -> list[str]:
    """The printed tables: decode against the floors, prefill and cycle against HF, memory, then the targets."""
    load = ", ".join(f"{n} thr {before:.2f} -> {after:.2f}" for n, (before, after) in loads.items())
    lines = [f"model: {model}; decode and prefill at a {context}-token context; engines: median, floors: best",
             f"load average (1 min) before -> after each thread count: {load}"]
    for workload in ("layers", "full"):
        lines += ["", f"{WORKLOADS[workload]}: ms a token", *decode_table(workload, results, nbytes[workload])]
    for workload in ("prefill", "cycle"):
        lines += ["", f"{WORKLOADS[workload]}: ms", *versus_hf_table(workload, results)]
    lines += ["", f"worker holding the model (VlaEngine, {WORKER_STEPS} frame steps), fresh process per format: MiB",
              f"{'':18}{'peak (VmHWM)':>14}{'at end (VmRSS)':>16}{'of it file-backed':>19}"]
    lines += [f"ours {fmt:13}{kib['VmHWM'] / 1024:>14.0f}{kib['VmRSS'] / 1024:>16.0f}{kib['RssFile'] / 1024:>19.0f}"
              for fmt, kib in memory.items()]
    return lines + ["", "targets:", *map(target_line, found)]


def make_model(args: argparse.Namespace, work: Path) -> Path:
    """``--model``, or a random checkpoint as ``init-model`` writes it: the 1.5B shape with 4 layers (smoke:
    the tiny preset with 1 layer)."""
    if args.model:
        return args.model
    config = preset("tiny", 1) if args.smoke else preset("qwen2.5-1.5b-shape", 4)
    return write_random_model(work / "model", config, seed=0)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="checkpoint (default: the 1.5B shape, 4 layers, random, bf16)")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated (default 1,2)")
    parser.add_argument("--rounds", type=int, default=5, help=f"interleaved rounds of {REPEATS} calls a case")
    parser.add_argument("--context", type=int, default=512, help="tokens cached before each decode and prefill")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--smoke", action="store_true", help="everything tiny, once: checks the script runs")
    args = parser.parse_args(argv)
    args.threads = [int(n) for n in args.threads.split(",")]
    args.repeats, args.settle = (1, 0.0) if args.smoke else (REPEATS, SETTLE_S)
    if args.smoke:
        args.rounds, args.context = 1, 32
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # as bench_model: Numba's OpenMP layer beside torch's (and CTranslate2's) OpenMP in one process slowed
    # transformers' calls; this process launches kernels from one thread, which workqueue allows
    numba.config.THREADING_LAYER = "workqueue"
    missing = ctranslate2_missing()
    if missing:
        print(missing)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model(args, Path(tmp))
        # workers first: the parent then holds nothing large that a spawned process could be charged for
        memory = {fmt: worker_memory(model_dir, fmt, args.context) for fmt in FORMATS}
        setup = set_up(model_dir, Path(tmp), args.context, not missing)
        nbytes = {workload: {fmt: ours.bytes_a_token(rows) for fmt, ours in setup.ours.items()}
                  for workload, rows in (("layers", setup.ours["float32"].bins), ("full", slice(None)))}
        floor = Floor(max(max(sizes.values()) for sizes in nbytes.values()))
        results, loads = {}, {}
        for n in args.threads:
            before = os.getloadavg()[0]
            results[n] = at_threads(setup, n, floor, nbytes, args)
            loads[n] = (before, os.getloadavg()[0])
    c = setup.ours["float32"].backend.config
    model = f"{model_dir.name}: {c.num_hidden_layers} layers, hidden {c.hidden_size}, vocab {c.vocab_size}"
    shipped_format = load_checkpoint(SHIPPED).format_of("model.embed_tokens.weight")  # reasoning.weights: auto
    found = targets(results, memory, shipped_format)
    print("\n".join(report(model, args.context, results, nbytes, memory, found, loads)))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "model": model, "context": args.context, "load_average": {str(n): load for n, load in loads.items()},
            "bytes_a_token": nbytes, "ms": {str(n): r for n, r in results.items()}, "worker_kib": memory,
            "targets": found, "ctranslate2": missing or "installed"}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
