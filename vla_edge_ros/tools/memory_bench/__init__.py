"""``vla-edge memory-bench``: can the model forget the right things?

Each episode is a ``CueScene``: one cue frame (class = episode index % K), N near-identical
distractor frames, then a query frame. At the query we ask each KV policy whether what it kept
still holds the cue:

- ``fifo`` / ``cosine`` with a memory budget of F frames (KV arena = prompt + F * tokens_per_frame
  + dof tokens): ``cue_kept`` (the cue frame's slots are still one of the policy's frames; tracked
  by identity of the policy's entry, because slot numbers are reused after evictions) and
  ``cue_attention`` (attention mass of the query frame's last token on the cue's slots, summed
  over them, mean over layers and heads, taken by ``attention.py``; 0 once evicted), beside
  ``uniform_attention`` (cue tokens / visible tokens: what a reader that looks everywhere equally
  would give).
- ``aura`` (F does not apply: it keeps no past frames as KV): nearest-prototype readout of what
  the memory adds to the present at the query, r - v_query, where r = W q + b is the read (q from
  the query frame exactly as ``AuraPolicy`` computes it, read before the query is written) and
  v_query the query frame's own value (W_v z_w). Subtracting the present matters: the episodes' own
  tables and clutter move the raw read far more than a small cue does, and a readout of the raw
  read scored chance even on a perfect memory (the ceiling, ``aura_readout_ceiling``). Prototypes
  are per-class mean reads over separate prototype episodes (other seeds, same N); a read is
  classified by its highest cosine to (prototype - mean prototype) after subtracting the same mean.
  Four gates run: the ``surprise`` gate (the policy's defaults), ``every_frame`` (a periodic gate of
  rate 1), and ``random`` / ``periodic`` at the write rate the surprise gate measured in that N (the
  same write budget); all but the first are evaluation's baselines (``tools/aura_gates.py``).
- ``dms`` with the same F-frame arena as fifo and cosine, per target ratio r (``dms_targets``), on
  episodes of the same scenes with ``dms_lead_in`` look-alike frames before the cue. Without them
  the cue would be an episode's first frame, judged against the text prompt alone and, with no score
  history yet, against its own quantile, so dms would keep 1/r of it whatever it showed; with them
  the cue must stand out from a window of near-duplicates, as it must for cosine (fifo keeps the
  newest F frames, so frames before the cue change nothing for it). Reported: ``cue_kept`` (the
  fraction of episodes in which some KV head still reads some cue token: dms keeps parts of frames),
  ``cue_entries_kept`` (the fraction of the cue's (token, layer, KV head) entries still read),
  ``cue_centre_kept`` (the same for the one token whose grid cell holds the centre of the cue disc:
  did the heads keep the part of the frame that carries the cue, more than the 1/r they keep of
  everything?),
  ``cue_attention`` (as for fifo, over the cue tokens still held; a head that evicted one gives it no
  weight), ``uniform_attention`` (mean over heads of cue entries / tokens the head reads),
  ``compression`` (tokens seen / tokens kept, pooled over heads) and ``forced_evictions``. The
  compression claim is measured apart (``dms_compression``) on a stream of ``compression_frames``
  frames in an arena that holds every token, so what is kept is what the heads chose, never what
  lack of room forced.

The package, one job per module: ``spec`` (what is swept, the episodes), ``cells`` (each cell's policy
and arena), ``attention`` (the attention probe, beside the runtime's forward), ``measure`` (what one
unit measures), ``overhead`` (per-frame timings), ``scoring`` (episodes to a row), ``claims`` (the
verdicts), ``runner`` (the sweep as units), ``report`` (``memory_bench.json``: its schema, the table).
"""

from .report import SCHEMA, format_table, write_report
from .runner import run_bench
from .spec import AURA_GATES, BenchSpec

__all__ = ["AURA_GATES", "SCHEMA", "BenchSpec", "format_table", "run_bench", "write_report"]
