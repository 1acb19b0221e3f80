"""The training stages: behaviour cloning (and on the arm DAgger), then the aura memory and the dms gates on the
frozen decoder.

1. Behaviour cloning: decoder, frame encoder and action head regress the expert's command at the
   last token of every frame (MSE on the normalised command; a chunked ``mlp`` head: L1 over the expert's
   chunk, as OpenVLA-OFT trains it, see ``action_error``), in two parts. ``perception`` sees
   single frames whose command the frame itself determines (the goal marked, the robot anywhere),
   each from a fresh layout: the frames of one episode are nearly alike, so sequence batches carry
   little variety (the model needs ~10x more steps on them to learn where the robot and the goal
   are), and a few hundred layouts are memorised rather than understood (held-out loss 5x the
   training loss). ``behaviour_cloning`` then trains on whole and partial episodes, where the
   decoder learns to carry the cue through the hold. On the Meta-World arm, ``dagger`` goes on with the
   policy's own closed-loop episodes, labelled by the expert, beside the demonstrations.
2. ``train_aura``: only the aura projections and write gate learn. Each frame is seen as the engine's
   aura policy shows it: prompt, one memory token (what the fast weights return before this frame's
   write), the frame; the write then stores the frame's last hidden state (``aura_unroll``). Loss: the
   action error plus a one-sided penalty on the write rate above rho.
   ``AuraSpec.train_decoder`` trains the decoder with the memory instead (alone, measured, it did
   not make the policy use its memory). ``AuraSpec.cue_writes`` (with the decoder) adds privileged
   write supervision: writes are forced where the cue appears, so the memory holds the cue when the
   decoder must act on it, then the gate takes over (see ``write_forcing``). With ``memory_warmup``
   the memory first learns alone to say where the goal was (``_warm_memory``); only that, and enough
   steps after it, made the decoder read the memory (README, Training).
   ``AuraSpec.dagger_episodes`` puts the policy's own closed-loop episodes, driven through the runtime, in
   every batch (``aura_batches``).
3. ``train_dms``: only the per-layer dms gates learn. The student reads the whole episode with
   per-KV-head evictions enforced once a token has left the window; the teacher is the same frozen
   model reading everything. Loss: the student's action error against the teacher's plus a one-sided
   penalty on the fraction of decisions that keep a token above 1 / target ratio.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from .demos import Demo, perception_samples, sample_frames, whole_episode
from .aura_step import AuraPass, aura_frame
from .spec import AuraSpec, BcSpec, DaggerSpec, DmsSpec, EpisodeStageSpec, StageSpec
from .torch_model import DmsMask, Prompts, VlaModel, straight_through
from .wording import Wording

Progress = Callable[[int, dict[str, float]], None]
T = TypeVar("T")
VIEWS_PER_LAYOUT = 8
WHERE_WEIGHT = 1.0
GOAL_STILL = 1e-6  # a goal within this of where frame 0 showed it has not moved ([-1, 1] units)
WARMUP_PAIRS = 64  # the memory warm-up's batch: cue + later frame of this many episodes
AURA_OPEN_FRACTION = 1 / 3  # frozen decoder: the first steps write every frame, so the read-out learns before the gate may close


@dataclass
class Batch:
    frames: torch.Tensor   # [B, F, S, S, 3] uint8, zero frames after a sequence's end
    labels: torch.Tensor   # [B, F, H, 2]: the expert's chunk at each frame (H = 1: its command)
    where: torch.Tensor    # [B, F, 4] robot and goal position, mapped to [-1, 1]
    valid: torch.Tensor    # [B, F] bool
    cue: torch.Tensor      # [B, F] bool: the frame shows the goal's ring (``Demo.cue_frames``), privileged
    states: torch.Tensor   # [B, F, 6] the robot's odometry at each frame (read by a model with a state token)
    prompts: Prompts       # each sequence's instruction


def make_batch(demos: list[Demo], picks: list[np.ndarray]) -> Batch:
    """Pad the picked frames of each demo to the longest pick."""
    length = max(p.size for p in picks)
    size = demos[0].frames.shape[1]
    frames = np.zeros((len(demos), length, size, size, 3), np.uint8)
    labels = np.zeros((len(demos), length, *demos[0].chunks.shape[1:]), np.float32)
    where = np.zeros((len(demos), length, 4), np.float32)
    valid = np.zeros((len(demos), length), bool)
    cue = np.zeros((len(demos), length), bool)
    states = np.zeros((len(demos), length, demos[0].states.shape[1]), np.float32)
    for row, (demo, pick) in enumerate(zip(demos, picks)):
        frames[row, :pick.size] = demo.frames[pick]
        labels[row, :pick.size] = demo.chunks[pick]
        where[row, :pick.size] = demo.where[pick]
        valid[row, :pick.size] = True
        cue[row, :pick.size] = pick < demo.cue_frames
        states[row, :pick.size] = demo.states[pick]
    return Batch(torch.from_numpy(frames), torch.from_numpy(labels), torch.from_numpy(2 * where - 1),
                 torch.from_numpy(valid), torch.from_numpy(cue), torch.from_numpy(states),
                 Prompts.of([demo.prompt for demo in demos]))


def write_labels(batch: Batch) -> torch.Tensor:
    """[B, F] 1.0 where the cue appears: the first frame of each run of cue frames, i.e. frame 0 of a
    whole episode of either task. The privileged write targets of ``AuraSpec.cue_writes``: one
    delta-rule step (beta 1/2, with the bias) makes the memory return that frame's value exactly, so the
    later cue frames (the same ring, in ``reach`` on every frame) are not surprising and add nothing; a
    label on every cue frame would ask the gate to write all of ``reach`` and to count frames it cannot
    tell apart in ``cue-reach``."""
    cue = batch.cue & batch.valid
    before = torch.cat([torch.zeros_like(cue[:, :1]), cue[:, :-1]], dim=1)
    return (cue & ~before).float()


def goal_unmoved(batch: Batch) -> torch.Tensor:
    """[B, F] bool: the goal is where frame 0 showed it. The memory is asked where the goal is only there: a
    chase goal moves on after the written frame, so where it is later cannot be recalled, and with those frames
    in its regression the memory's error floored at 0.05 (0.006 without them) and aura fell to chance."""
    return (batch.where[..., 2:] - batch.where[:, :1, 2:]).abs().amax(-1) < GOAL_STILL


def _static_goal(demo: Demo) -> bool:
    """Whether ``demo``'s goal stays where frame 0 showed it, by ``goal_unmoved``'s rule."""
    return bool(np.abs(demo.where[:, 2:] - demo.where[:1, 2:]).max() < GOAL_STILL / 2)


def batches(demos: list[Demo], spec: EpisodeStageSpec, rng: np.random.Generator, partial: bool,
            max_stride: int = 1) -> Iterator[Batch]:
    """``spec.steps`` batches of random demos; ``partial`` samples frame subsets (``sample_frames``), else whole
    episodes (``whole_episode``), every k-th frame, k drawn in [1, ``max_stride``]."""
    pick = sample_frames if partial else whole_episode
    for _ in range(spec.steps):
        chosen = [demos[i] for i in rng.choice(len(demos), size=spec.batch, replace=False)]
        picks = [pick(d, rng, spec.max_frames, max_stride) for d in chosen]
        yield make_batch(chosen, picks)


def masked_mse(predicted: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return ((predicted - target) ** 2).sum(-1)[valid].mean()


def action_error(model: VlaModel, predicted: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The action loss of chunks [B, F, H, dof] on the valid frames [B, F]: per action the squared error summed over
    the dof for the ``linear`` head (what every checkpoint before chunks was trained on), the absolute error for
    the ``mlp`` chunk head (OpenVLA-OFT's L1), each averaged over the chunk's H actions. Every action of a chunk
    counts: its label is defined past the episode's end (``CueReachEnv.expert_chunk``)."""
    if model.c.action.head == "mlp":
        per_action = (predicted - target).abs().sum(-1)
    else:
        per_action = ((predicted - target) ** 2).sum(-1)
    return per_action.mean(-1)[valid].mean()


def sequence_hidden(model: VlaModel, batch: Batch, dms: DmsMask | None = None
                    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Final-norm hidden states [B, F, H] at each observation's last token of prompt + observations (where
    the engine reads the action), and the dms gates' keep probabilities."""
    rows, count = batch.frames.shape[:2]
    tokens = model.observation_tokens(batch.frames, batch.states).reshape(rows, -1, model.c.hidden_size)
    prompt = model.prompt_embeddings(batch.prompts.ids)
    hidden, keeps = model.model(torch.cat([prompt, tokens], dim=1), dms, batch.prompts)
    per_frame = model.c.observation_tokens
    last = batch.prompts.width + per_frame * torch.arange(count) + per_frame - 1
    return hidden[:, last], keeps


def sequence_actions(model: VlaModel, batch: Batch, dms: DmsMask | None = None
                     ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Chunks [B, F, H, dof] the engine would decode after each frame, and the dms keep probabilities."""
    hidden, keeps = sequence_hidden(model, batch, dms)
    return model.actions(hidden), keeps


def _schedule(optimiser: torch.optim.Optimizer, spec: StageSpec) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over 5 % of the steps, then cosine decay to a tenth."""
    warmup = max(1, spec.steps // 20)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / max(1, spec.steps - warmup)))

    return torch.optim.lr_scheduler.LambdaLR(optimiser, factor)


def fit(params: list[torch.nn.Parameter] | list[dict[str, Any]], spec: StageSpec, steps: Iterable[T],
        loss_of: Callable[[T], tuple[torch.Tensor, dict[str, float]]], progress: Progress) -> None:
    """AdamW over ``params`` (a list of tensors at ``spec.lr``, or parameter groups with their own lr)."""
    optimiser = torch.optim.AdamW(params, lr=spec.lr, weight_decay=0.0)
    schedule = _schedule(optimiser, spec)
    trained = [p for group in optimiser.param_groups for p in group["params"]]
    skipped, limit = 0, max_skipped_steps(spec.steps)
    for step, batch in enumerate(steps):
        loss, figures = loss_of(batch)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(trained, 1.0)
        finite = bool(torch.isfinite(norm))  # one non-finite gradient would turn every weight it reaches NaN for good
        if finite:
            optimiser.step()
        else:
            skipped += 1
            if skipped > limit:
                raise ValueError(f"training diverged: {skipped} of {step + 1} steps had a non-finite gradient "
                                 f"(at most {limit} of a stage's {spec.steps} are skipped); "
                                 f"lower its lr")
        schedule.step()
        progress(step, {"loss": float(loss.detach()), **figures, "skipped": float(not finite)})


def max_skipped_steps(steps: int) -> int:
    """Steps with a non-finite gradient a stage skips (no update, counted as ``skipped``) before it stops: an
    isolated one (a rare batch) is survivable, a run of them is a diverged stage."""
    return max(3, steps // 100)


def _freeze(model: VlaModel, trainable: list[torch.nn.Parameter]) -> None:
    keep = {id(p) for p in trainable}
    for param in model.parameters():
        param.requires_grad_(id(param) in keep)


# whose layouts show what to do: cue-reach's cue is reach's ring
PERCEPTION_TASKS = {"reach": "reach", "cue-reach": "reach", "lang-reach": "lang-reach", "chase": "chase"}


def perception_batches(spec: StageSpec, rng: np.random.Generator, image_size: int, tasks: tuple[str, ...],
                       wording: Wording, chunk: int = 1) -> Iterator[Batch]:
    """Single frames that show what to do, ``VIEWS_PER_LAYOUT`` from each fresh layout, the layouts' tasks
    alternating over those that show it (``cue-reach``'s cue is ``reach``'s ring; ``lang-reach``'s goal
    is in its instruction; ``chase``'s ring is on the goal wherever its path has it), each labelled with the
    expert's chunk of ``chunk`` actions."""
    shown_by = tuple(dict.fromkeys(PERCEPTION_TASKS[task] for task in tasks))
    layouts = max(1, spec.batch // VIEWS_PER_LAYOUT)
    for _ in range(spec.steps):
        views = [perception_samples(int(seed), image_size, VIEWS_PER_LAYOUT, shown_by[i % len(shown_by)], wording,
                                    chunk) for i, seed in enumerate(rng.integers(2**31, 2**62, size=layouts))]
        frames, labels, where, states = (torch.from_numpy(np.concatenate(parts)[:, None]) for parts in
                                         zip(*((v.frames, v.chunks, v.where, v.states) for v in views)))
        shown = torch.ones(frames.shape[0], 1, dtype=torch.bool)
        prompts = Prompts.of([view.prompt for view in views for _ in range(len(view.frames))])
        yield Batch(frames, labels, 2 * where - 1, shown, shown, states, prompts)


def perception(model: VlaModel, spec: StageSpec, rng: np.random.Generator, tasks: tuple[str, ...], wording: Wording,
               progress: Progress) -> None:
    views = perception_batches(spec, rng, model.c.vision.image_size, tasks, wording, model.c.action.chunk)
    _fit_actions(model, spec, views, progress)


def demo_perception(model: VlaModel, demos: list[Demo], spec: StageSpec, rng: np.random.Generator,
                    progress: Progress) -> None:
    """``perception`` where fresh layouts cannot be posed at will (Meta-World's arm): each step ``spec.batch``
    single frames, each from a random demonstration (distinct ones while there are enough), alone with its prompt,
    so a batch spans as many layouts as it can and no frame history can stand in for what the frame shows."""
    def views() -> Iterator[Batch]:
        for _ in range(spec.steps):
            chosen = [demos[i] for i in rng.choice(len(demos), size=spec.batch, replace=spec.batch > len(demos))]
            yield make_batch(chosen, [rng.integers(len(demo.frames), size=1) for demo in chosen])

    _fit_actions(model, spec, views(), progress)


def _fit_actions(model: VlaModel, spec: StageSpec, steps: Iterator[Batch], progress: Progress) -> None:
    """Decoder, encoder and head on the action error of every valid frame of ``steps``' batches, plus
    ``WHERE_WEIGHT`` x the error of ``where_head``'s robot and goal positions (see ``VlaModel``)."""
    params = model.decoder_parameters() + list(model.where_head.parameters())
    _freeze(model, params)
    fit(params, spec, steps, lambda batch: _action_loss(model, batch), progress)


def _action_loss(model: VlaModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    """Action error + ``WHERE_WEIGHT`` x position error of every valid frame of a frame-history batch."""
    hidden, _ = sequence_hidden(model, batch)
    action = action_error(model, model.actions(hidden), batch.labels, batch.valid)
    where = masked_mse(model.where_head(hidden), batch.where, batch.valid)
    return action + WHERE_WEIGHT * where, {"action": float(action.detach()), "where": float(where.detach())}


def behaviour_cloning(model: VlaModel, demos: list[Demo], spec: BcSpec, rng: np.random.Generator,
                      progress: Progress) -> None:
    _fit_actions(model, spec, batches(demos, spec, rng, partial=True, max_stride=spec.max_stride), progress)


def aggregated(demos: list[Demo], steps: int, batch: int, rounds: int, collect: Callable[[int], list[Demo]],
               rng: np.random.Generator) -> Iterator[list[Demo]]:
    """DAgger's episodes for each of ``steps`` batches: half of each (``batch // 2``) from the policy's own episodes,
    which ``collect(round)`` gathers with the weights of the time (``rounds`` times, evenly spread, the first at
    step 0) into a pool that grows with each (DAgger's aggregation); the other half demonstrations, so what the
    experts showed stays."""
    every = max(1, steps // rounds)
    own = batch // 2
    pool: list[Demo] = []
    for step in range(steps):
        if step % every == 0 and step // every < rounds:
            pool.extend(collect(step // every))
        chosen = [demos[i] for i in rng.choice(len(demos), size=batch - own, replace=False)]
        yield chosen + [pool[i] for i in rng.choice(len(pool), size=own, replace=len(pool) < own)]


def dagger(model: VlaModel, demos: list[Demo], spec: DaggerSpec, rng: np.random.Generator,
           collect: Callable[[int], list[Demo]], progress: Progress) -> None:
    """Behaviour cloning on ``aggregated`` batches: the arm's demonstrations and the policy's own episodes
    (``collect``), sampled as bc samples its sequences."""
    chosen = aggregated(demos, spec.steps, spec.batch, spec.rounds, collect, rng)
    _fit_actions(model, spec, (make_batch(episodes, [sample_frames(d, rng, spec.max_frames, spec.max_stride)
                                                      for d in episodes]) for episodes in chosen), progress)


def aura_unroll(model: VlaModel, batch: Batch, beta: float, forced: torch.Tensor | None = None) -> AuraPass:
    """Every observation of ``batch`` as the aura policy runs it, in order: the memory token read before the
    observation, the decoder over prompt + memory token + observation, then the write from its last hidden
    state (``forced`` [B, F] replaces the gate's decisions where given). Later frames read what earlier
    forwards wrote, so the decoder is unrolled through time and the action error of a late frame reaches
    how frame 0 was understood."""
    count = batch.frames.shape[1]
    tokens = model.observation_tokens(batch.frames, batch.states)  # [B, F, T, H]
    prompt = model.prompt_embeddings(batch.prompts.ids)
    state = model.aura.empty(len(tokens))
    steps = []
    for f in range(count):
        state, step = aura_frame(model, prompt, batch.prompts, state, tokens[:, f], beta,
                                 None if forced is None else forced[:, f])
        steps.append(step)
    return AuraPass(*(torch.stack(parts, dim=1) for parts in zip(*steps)))


def aura_actions(model: VlaModel, batch: Batch, beta: float, forced: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunks [B, F, H, dof] of every frame as ``aura_unroll`` runs them, and the writes [B, F]."""
    run = aura_unroll(model, batch, beta, forced)
    return model.actions(run.hidden), run.writes


def write_forcing(spec: AuraSpec, step: int, steps: int, batch: Batch) -> tuple[torch.Tensor | None, float]:
    """(the writes to force on ``batch`` at ``step`` of ``steps``, or None: the gate decides; the weight of the
    write-label loss). ``cue_writes``: the labels for the first ``forced_fraction`` of the steps, the label
    loss at full weight there, then falling linearly to zero at the last step, so the gate ends trained by
    the action loss and the write-rate penalty alone, in control. Otherwise the frozen decoder's open phase:
    every frame for the first ``AURA_OPEN_FRACTION`` (no labels)."""
    if spec.cue_writes:
        start = spec.forced_fraction * steps
        if step < start:
            return write_labels(batch), spec.label_weight
        return None, spec.label_weight * max(0.0, 1.0 - (step - start) / max(1.0, steps - 1 - start))
    if not spec.train_decoder and step < steps * AURA_OPEN_FRACTION:
        return torch.ones(batch.valid.shape), 0.0
    return None, 0.0


def _label_loss(logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """BCE of the gate's logits toward the write labels, the mean over labelled frames and the mean over
    the others weighted alike (about one frame in 30-90 is labelled: a plain mean would teach never-write)."""
    losses = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    positive, negative = valid & (labels > 0.5), valid & (labels < 0.5)
    parts = [losses[mask].mean() for mask in (positive, negative) if mask.any()]
    return torch.stack(parts).mean()


def _aura_loss(model: VlaModel, batch: Batch, spec: AuraSpec, step: int, where: bool
               ) -> tuple[torch.Tensor, dict[str, float]]:
    """The aura episodes' loss: action error on every valid frame (+ the position error when ``where``), the
    one-sided write-rate penalty, and the write-label BCE per ``write_forcing``. Figures: ``write_rate``
    counts the writes made (forced ones too); ``gate_rate`` and ``gate_recall`` are what the gate alone
    decides (of all frames, of the labelled ones)."""
    forced, label_weight = write_forcing(spec, step, spec.steps, batch)
    hidden, writes, logits, memory = aura_unroll(model, batch, spec.beta, forced)
    action = action_error(model, model.actions(hidden), batch.labels, batch.valid)
    rate = writes[batch.valid].mean()
    loss = action + spec.penalty * F.relu(rate - spec.rho)
    gate = (logits > 0)[batch.valid].float().mean()
    figures = {"action": float(action.detach()), "write_rate": float(rate.detach()), "gate_rate": float(gate)}
    if where:
        position = masked_mse(model.where_head(hidden), batch.where, batch.valid)
        loss = loss + WHERE_WEIGHT * position
        figures["where"] = float(position.detach())
    if spec.memory_goal > 0:
        written = ((writes.detach().cumsum(1) - writes.detach()) > 0) & batch.valid  # the memory holds something
        written = written & goal_unmoved(batch)
        if written.any():
            goal = masked_mse(model.memory_goal_head(memory), batch.where[..., 2:], written)
            loss = loss + spec.memory_goal * goal
            figures["memory_goal"] = float(goal.detach())
    if spec.cue_writes:
        labels = write_labels(batch)
        bce = _label_loss(logits, labels, batch.valid)
        loss = loss + label_weight * bce
        figures.update(write_bce=float(bce.detach()), gate_recall=float((logits > 0)[labels > 0.5].float().mean()),
                       forced=float(forced is not None))
    return loss, figures


def aura_batches(demos: list[Demo], spec: AuraSpec, rng: np.random.Generator,
                 collect: Callable[[int], list[Demo]] | None = None) -> Iterator[Batch]:
    """The aura stage's whole episodes: demonstrations, or with ``spec.dagger_episodes`` half of each batch
    from the policy's own closed-loop episodes (``collect``, the trainer's: DAgger, the weights of the time
    driving fresh layouts through the runtime with their aura memory, aggregated over ``spec.dagger_rounds``
    collections). Why the runtime: a chunked model acts once a cycle, about every 12th tick, and executes
    its chunk between, so the states its memory must carry it through are those of the timeline, not of a
    policy acting on every frame."""
    if not spec.dagger_episodes:
        yield from batches(demos, spec, rng, partial=False, max_stride=spec.max_stride)
        return
    if collect is None:
        raise ValueError("aura.dagger_episodes: the policy's own episodes need a collection (the trainer's)")
    for chosen in aggregated(demos, spec.steps, spec.batch, spec.dagger_rounds, collect, rng):
        yield make_batch(chosen, [whole_episode(demo, rng, spec.max_frames, spec.max_stride) for demo in chosen])


def train_aura(model: VlaModel, demos: list[Demo], spec: AuraSpec, rng: np.random.Generator, progress: Progress,
               collect: Callable[[int], list[Demo]] | None = None) -> None:
    """The aura memory on the frozen decoder (``spec.train_decoder``: with the decoder, see
    ``_train_aura_and_decoder``), after the memory warm-up when ``spec.memory_warmup`` asks for one. Each
    step: ``spec.batch`` whole episodes run frame by frame as the aura policy runs them (``aura_unroll``),
    the action error taken on every valid frame. Writes are forced early on (``write_forcing``): without
    labels the first ``AURA_OPEN_FRACTION`` of the steps write every frame, since with a random read-out
    every write is noise and the gate learned never to write, where the sigmoid is flat and it cannot
    recover."""
    episodes = [demo for demo in demos if not spec.tasks or demo.task in spec.tasks]
    if spec.memory_warmup:
        _warm_memory(model, spec, episodes, rng, progress)
    if spec.train_decoder:
        _train_aura_and_decoder(model, episodes, demos, spec, rng, progress, collect)
        return
    params = [*model.aura.parameters(), *model.memory_goal_head.parameters()]
    _freeze(model, params)

    def loss_of(step_batch: tuple[int, Batch]) -> tuple[torch.Tensor, dict[str, float]]:
        step, batch = step_batch
        return _aura_loss(model, batch, spec, step, where=False)

    fit(params, spec, enumerate(aura_batches(episodes, spec, rng, collect)), loss_of, progress)


def cue_pairs(demos: list[Demo], count: int, rng: np.random.Generator) -> Batch:
    """``count`` random demos whose goal stays put (``goal_unmoved``), two frames of each: frame 0 (the cue,
    the frame ``write_labels`` marks) and one later frame, where the memory must still say where the cue was."""
    still = [demo for demo in demos if _static_goal(demo)]
    if not still:
        raise ValueError("the memory warm-up needs demonstrations whose goal stays put (every one given is chase)")
    chosen = [still[i] for i in rng.choice(len(still), size=count, replace=count > len(still))]
    return make_batch(chosen, [np.array([0, rng.integers(1, len(d.frames))]) for d in chosen])


def _warm_memory(model: VlaModel, spec: AuraSpec, demos: list[Demo], rng: np.random.Generator,
                 progress: Progress) -> None:
    """``spec.memory_warmup`` steps of ``aura.*`` alone (and ``memory_goal_head``) on ``cue_pairs``: frame 0
    written, the goal's position regressed from the memory token the later frame reads; two frames per
    episode, not all of them, so a step costs a few decoder passes. Through the action loss alone the
    memory token stayed at the mean's goal error; this way it learns it in a few hundred steps, so the
    decoder then reads a token that says where the cue was."""
    params = [*model.aura.parameters(), *model.memory_goal_head.parameters()]
    _freeze(model, params)
    warmup = StageSpec(steps=spec.memory_warmup, batch=WARMUP_PAIRS, lr=spec.lr)

    def loss_of(batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        memory = aura_unroll(model, batch, spec.beta, write_labels(batch)).memory
        goal = F.mse_loss(model.memory_goal_head(memory[:, 1]), batch.where[:, 1, 2:], reduction="sum") / len(memory)
        return goal, {"memory_goal": float(goal.detach())}

    fit(params, warmup, (cue_pairs(demos, WARMUP_PAIRS, rng) for _ in range(warmup.steps)), loss_of, progress)


def _train_aura_and_decoder(model: VlaModel, episodes: list[Demo], demos: list[Demo], spec: AuraSpec,
                            rng: np.random.Generator, progress: Progress,
                            collect: Callable[[int], list[Demo]] | None) -> None:
    """The aura memory and the decoder together (an option, not the default). Each step: aura episodes (from
    ``episodes``) as ``train_aura`` takes them, with the position error too, plus ``spec.bc_batch``
    frame-history sequences of ``demos`` as behaviour cloning draws them, so that the decoder keeps serving
    the KV policies on every task. Without
    ``cue_writes`` the gate decides from the first step; measured from models/sim (README, Training) that
    did not make aura use its memory (cue swap at chance, no-write ablation equal) and lowered fifo's
    success on both tasks. ``where_head`` learns at the memory's rate: it is not exported, so a stage
    started from a checkpoint starts it afresh."""
    decoder = model.decoder_parameters()
    memory = [*model.aura.parameters(), *model.where_head.parameters(), *model.memory_goal_head.parameters()]
    _freeze(model, decoder + memory)
    groups = [{"params": decoder, "lr": spec.decoder_lr}, {"params": memory, "lr": spec.lr}]
    aura = aura_batches(episodes, spec, rng, collect)
    histories = batches(demos, EpisodeStageSpec(spec.steps, spec.bc_batch, spec.lr, spec.max_frames), rng, partial=True,
                        max_stride=spec.max_stride)
    steps = zip(aura, histories) if spec.bc_batch else ((batch, None) for batch in aura)

    def loss_of(step_pair: tuple[int, tuple[Batch, Batch | None]]) -> tuple[torch.Tensor, dict[str, float]]:
        step, (batch, history) = step_pair
        loss, figures = _aura_loss(model, batch, spec, step, where=True)
        if history is not None:
            bc, bc_figures = _action_loss(model, history)
            loss = loss + bc
            figures["bc_action"] = bc_figures["action"]
        return loss, figures

    fit(groups, spec, enumerate(steps), loss_of, progress)


def train_dms(model: VlaModel, demos: list[Demo], spec: DmsSpec, rng: np.random.Generator, progress: Progress) -> None:
    params = model.dms_parameters()
    _freeze(model, params)
    per_frame = model.c.observation_tokens

    def loss_of(batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        count = batch.frames.shape[1]
        prompt = batch.prompts.width
        with torch.no_grad():
            teacher, _ = sequence_actions(model, batch)
        mask = DmsMask.for_frames(prompt, count, per_frame, spec.window)
        student, keeps = sequence_actions(model, batch, mask)
        frame_tokens = batch.valid.repeat_interleave(per_frame, dim=1)  # [B, F * T]
        keep_rate = torch.stack([straight_through(k, k > 0.5)[:, prompt:][frame_tokens].mean() for k in keeps]).mean()
        distill = action_error(model, student, teacher, batch.valid)
        loss = distill + spec.penalty * F.relu(keep_rate - 1.0 / spec.target_ratio)
        return loss, {"distill": float(distill.detach()), "keep_rate": float(keep_rate.detach())}

    fit(params, spec, batches(demos, spec, rng, partial=False), loss_of, progress)
