"""A new instruction's prompt as a block of its own: always started, its cost learned apart, loaded from the KV
store when the same instruction came before."""

from __future__ import annotations

import numpy as np
import pytest

from vla_edge_ros.config import GateKnobs, MemoryKnobs
from vla_edge_ros.engine.vla_engine import VlaEngine
from vla_edge_ros.kv_store import BlockStore, load_or_prefill_prompt, model_fingerprint
from vla_edge_ros.memory import build_policy
from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.runtime.admission import AdmissionGate, BlockKind, Verdict
from vla_edge_ros.runtime.block_costs import VirtualTimer, parse_cost
from vla_edge_ros.runtime.clock import NS_PER_MS, VirtualClock
from vla_edge_ros.runtime.reasoner import Reasoner
from vla_edge_ros.worlds.synthetic import SyntheticCamera

FIRST, SECOND = [11, 402, 77, 1030, 6], [21, 5, 900, 14, 77, 3, 8]


def _gate(clock: VirtualClock) -> AdmissionGate:
    return AdmissionGate(GateKnobs.of({"warmup_cycles": 2, "deadline_ms": 33.0}), clock=clock)


def test_a_required_block_always_starts_learns_its_cost_and_counts_a_long_one_as_missed():
    clock = VirtualClock(0)
    gate = _gate(clock)
    verdicts = []
    for cost_ms in (10, 10, 50, 10):
        block = gate.start_required(BlockKind.PROMPT)
        verdicts.append(block.verdict)
        clock.now += cost_ms * NS_PER_MS
        gate.record(block)
    stats = gate.snapshot().kinds["prompt"]
    assert verdicts == [Verdict.WARMUP, Verdict.WARMUP, Verdict.ADMITTED, Verdict.ADMITTED]  # never refused
    assert stats.missed == 1 and stats.mean_ms is not None and stats.mean_ms > 10  # the 50 ms one
    with pytest.raises(ValueError, match="admitted, never required"):
        gate.start_required(BlockKind.DECODE)


def test_retask_runs_the_change_as_a_prompt_block_on_the_virtual_clock(tiny_model):
    clock = VirtualClock(0)
    engine = VlaEngine(load_checkpoint(tiny_model), backend="numpy", kv_capacity_tokens=128)
    engine.set_prompt(FIRST)
    reasoner = Reasoner(engine, _gate(clock), VirtualTimer(clock, parse_cost("fixed:encode=8ms,decode=1ms,prompt=20ms")))
    reasoner.retask(lambda: engine.replace_prompt(SECOND))
    assert clock() == 20 * NS_PER_MS and engine.prompt_ids.tolist() == SECOND
    assert reasoner.gate.snapshot().kinds["prompt"].warmup == 1


def test_a_repeated_instruction_loads_its_stored_kv_and_keeps_the_memory(tiny_model, tmp_path):
    checkpoint = load_checkpoint(tiny_model)
    engine = VlaEngine(checkpoint, backend="numpy", kv_capacity_tokens=128,
                       policy=build_policy(MemoryKnobs.of({"kv.policy": "fifo"})))
    store = BlockStore(tmp_path / "store", model_fingerprint(checkpoint), aes_key=None, budget_bytes=1 << 30)
    load_or_prefill_prompt(engine, store, FIRST)
    camera = SyntheticCamera(height=48, width=64, seed=3)
    for _ in range(2):
        engine.step(camera.frame())
    assert not load_or_prefill_prompt(engine, store, SECOND, keep_memory=True)  # new: prefilled, then stored
    prefilled = engine.prompt_kv()
    assert load_or_prefill_prompt(engine, store, FIRST, keep_memory=True)  # came before: loaded
    assert load_or_prefill_prompt(engine, store, SECOND, keep_memory=True)
    loaded = engine.prompt_kv()
    np.testing.assert_array_equal(loaded["keys"], prefilled["keys"])
    assert engine.policy.frames_kept() == 2  # the episode went on through three instructions
