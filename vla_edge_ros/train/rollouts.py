"""The aura policy in torch, one frame at a time, and closed-loop episodes of it labelled by the expert.

``aura_frame`` is one step of what ``memory/aura.py`` does in the engine: read the memory, run the
decoder over prompt + memory token + frame, write. ``stages.aura_unroll`` strings it over recorded frames
for training; ``aura_rollouts`` lets it drive the simulator instead, so the frames are the ones the
policy itself visits, each labelled with the expert's command (a chunked head: its chunk) for the state
it shows (DAgger, Ross et al. 2011). Why: on demonstrations the remembered goal and the target in view
always agree, so the decoder may steer by the memory alone. In closed loop it did: of 14 held-out
failures, 12 stalled 0.08-0.31 from the right target (the memory's idea of where it was) and never closed
in on the target in view. Only the policy's own mistakes show it states where the two disagree.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ..model.vision import resize_frame
from ..worlds.sim.world import CueReachEnv, TaskSpec
from .demos import Demo, cue_frames
from .torch_model import FastWeightState, Prompts, VlaModel
from .wording import Wording


class AuraPass(NamedTuple):
    hidden: torch.Tensor   # [B, (F,) H] final-norm hidden state at each frame's last token
    writes: torch.Tensor   # [B, (F)] write decisions
    logits: torch.Tensor   # [B, (F)] the gate's logits
    memory: torch.Tensor   # [B, (F,) H] the memory token each frame read


def aura_frame(model: VlaModel, prompt: torch.Tensor, prompts: Prompts, state: FastWeightState, tokens: torch.Tensor,
               beta: float, forced: torch.Tensor | None = None) -> tuple[FastWeightState, AuraPass]:
    """One observation of the aura policy for a batch: the embeddings [B, P, H] of ``prompts`` and the
    observation's tokens [B, T, H] -> (the fast weights after its write, its ``AuraPass`` row); ``forced`` [B]
    replaces the gate's decisions where given."""
    read = model.aura.read(state, tokens)
    out, _ = model.model(torch.cat([prompt, read[:, None], tokens], dim=1), prompts=prompts)
    state, write, logit = model.aura.write(state, out[:, -1], beta, forced)
    return state, AuraPass(out[:, -1], write, logit, read)


def aura_rollouts(model: VlaModel, wording: Wording, tasks: list[TaskSpec], seeds: list[int], beta: float,
                  max_frames: int) -> list[Demo]:
    """One episode per seed (tasks alternating, worded by ``wording`` as a demonstration of that seed is),
    all run in one batch: the aura policy's command (a chunked head's first action: each frame acted on at
    once, no latency), clipped to the robot's [-1, 1], drives the robot; each frame is recorded with the
    expert's chunk for it (``CueReachEnv.expert_chunk``, as the demonstrations are labelled). An episode ends
    at success or after ``max_frames`` frames."""
    chunk = model.c.action.chunk
    size = model.c.vision.image_size
    envs = [CueReachEnv(tasks[i % len(tasks)], seed) for i, seed in enumerate(seeds)]
    said = [wording.prompt(wording.instruction(env, np.random.default_rng([seed, 3]))) for env, seed in zip(envs, seeds)]
    frames = [[resize_frame(env.reset(), size)] for env in envs]
    states = [[env.odometry()] for env in envs]
    labels: list[list[np.ndarray]] = [[] for _ in envs]
    where: list[list[np.ndarray]] = [[] for _ in envs]
    success = [False] * len(envs)
    running = np.ones(len(envs), bool)
    with torch.no_grad():
        prompts = Prompts.of(said)
        prompt = model.prompt_embeddings(prompts.ids)
        state = model.aura.empty(len(envs))
        for _ in range(max_frames):
            pixels = torch.from_numpy(np.stack([episode[-1] for episode in frames]))
            odometry = torch.from_numpy(np.stack([episode[-1] for episode in states]))
            state, step = aura_frame(model, prompt, prompts, state, model.observation_tokens(pixels, odometry), beta)
            commands = np.clip(model.actions(step.hidden)[:, 0].numpy().astype(np.float64), -1.0, 1.0)
            for i in np.flatnonzero(running):
                env = envs[i]
                labels[i].append(env.expert_chunk(chunk))
                where[i].append(np.concatenate([env.robot, env.targets[env.goal]]))
                outcome = env.step(commands[i])
                success[i] = outcome.success
                running[i] = not outcome.done and len(frames[i]) < max_frames
                if running[i]:
                    frames[i].append(resize_frame(outcome.frame, size))
                    states[i].append(env.odometry())
            if not running.any():
                break
    return [Demo(env.spec.name, np.stack(frames[i]), np.asarray(labels[i], np.float32),
                 np.asarray(where[i], np.float32), cue_frames(env.spec, len(frames[i])), success[i],
                 np.stack(states[i]), said[i])
            for i, env in enumerate(envs)]
