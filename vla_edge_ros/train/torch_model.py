"""The VLA model in PyTorch, for training: the engine's forward pass written for whole sequences.

The math is the NumPy reference's (``numerics/ops.py``, ``model/numpy_backend.py``): Qwen2 decoder
(RMSNorm, rotate-half RoPE, grouped-query attention with q/k/v bias, SwiGLU), the frame encoder
(normalise, cut into patches, pool per cell, project, add a per-token position embedding), the state
token (``model/state_token.py``: normalise, project) after the frame's tokens when the model reads the
robot's state, and the action head on the observation's last final-norm hidden state: ``linear``, tanh(W h + b),
one action; or ``mlp`` (``model/action_head.py``), tanh(fc2 GELU(fc1 h + b1) + b2) with the exact (erf) GELU, a
chunk of H actions, row i * dof + d of fc2 being action i's dimension d.
A batch's instructions differ in length (``Prompts``): each sequence continues right after its own
prompt, as the engine places it, and nothing reads the pads. Module names are the checkpoint's
tensor names, so ``state_dict()`` is what ``export`` writes and what the engine loads.

Two learned memory parts sit beside the decoder, each trained on the frozen decoder:

- ``AuraMemory``: the fast-weight memory of ``memory/aura.py`` (its ``hidden`` layout), stepped frame
  by frame beside the decoder, with the write gate hard in the forward pass and its sigmoid's gradient
  in the backward (straight-through);
- ``dms_gate`` in every attention layer: per-KV-head eviction logits alpha = W norm(x) + b; a token
  outside the window stays readable in a head iff alpha < 0 there (hard forward, sigmoid(-alpha)'s
  gradient backward), exactly the decisions ``memory/dms.py`` enforces with its learned gate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..model.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(head_dim: int, theta: float, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of positions * 1/theta^(2i/D) (fp32, as the engine computes them): [T, D/2] for positions [T],
    [B, 1, T, D/2] (one row per sequence, broadcast over heads) for positions [B, T]."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = positions.float()[..., None] * inv_freq
    if angles.dim() == 3:
        angles = angles[:, None]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + D/2) of x [B, heads, T, D]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def straight_through(soft: torch.Tensor, hard: torch.Tensor) -> torch.Tensor:
    """``hard`` in the forward pass, the gradient of ``soft`` in the backward."""
    return hard.to(soft.dtype) + soft - soft.detach()


@dataclass(frozen=True)
class Prompts:
    """A batch's prompts: ``ids`` [B, P] with each row's ``lengths`` [B] real tokens, padded at the end.

    A sequence is its padded prompt then what follows (frames, aura's memory token). The engine holds no
    pads, so a sequence's token after the prompt takes position ``length + k``, not ``P + k``, and no query
    reads a pad: the same numbers the engine computes for that prompt alone.
    """

    ids: torch.Tensor
    lengths: torch.Tensor

    @classmethod
    def of(cls, rows: Sequence[Sequence[int]]) -> Prompts:
        """One row per sequence, padded with id 0 (never read); ValueError for an empty row (the engine pins a
        prompt of at least one token)."""
        if not all(len(row) for row in rows):
            raise ValueError("a prompt holds at least one token")
        lengths = torch.tensor([len(row) for row in rows])
        ids = torch.zeros(len(rows), int(lengths.max()), dtype=torch.long)
        for row, tokens in enumerate(rows):
            ids[row, :len(tokens)] = torch.as_tensor(list(tokens), dtype=torch.long)
        return cls(ids, lengths)

    @classmethod
    def same(cls, ids: Sequence[int], batch: int) -> Prompts:
        """``ids`` for each of ``batch`` sequences."""
        return cls.of([list(ids)] * batch)

    @property
    def width(self) -> int:
        return self.ids.shape[1]

    def positions(self, total: int) -> torch.Tensor:
        """[B, total] RoPE positions of a sequence of ``total`` tokens that starts with these prompts."""
        index = torch.arange(total)
        pads = (self.width - self.lengths)[:, None]
        return torch.where(index < self.width, index, index - pads)

    def readable(self, total: int) -> torch.Tensor | None:
        """[B, total] true where a key is a token (not a pad); None when no row is padded."""
        if bool((self.lengths == self.width).all()):
            return None
        index = torch.arange(total)
        return (index >= self.width) | (index < self.lengths[:, None])


@dataclass
class DmsMask:
    """Which keys the dms gates may hide: those older than the window, outside the pinned prompt.

    ``always`` [T, T] is true where a query reads a key whatever the decision (the prompt, and keys
    inside the window of the query's frame); ``causal`` [T, T] where it may read it at all.
    """

    always: torch.Tensor
    causal: torch.Tensor

    @classmethod
    def for_frames(cls, prompt_tokens: int, frames: int, tokens_per_frame: int, window: int) -> DmsMask:
        """A frame's queries read, whatever was decided, every key of the prompt, of their own frame and
        every key with fewer than ``window`` tokens after it when their frame's forward started (the
        engine enforces decisions after each forward, on what is older than the newest ``window``)."""
        total = prompt_tokens + frames * tokens_per_frame
        index = torch.arange(total)
        frame_start = prompt_tokens + (index - prompt_tokens).div(tokens_per_frame, rounding_mode="floor") * tokens_per_frame
        frame_start = torch.where(index < prompt_tokens, index, frame_start)
        causal = index[None, :] <= index[:, None]
        in_window = index[None, :] >= (frame_start[:, None] - window)
        always = causal & (in_window | (index[None, :] < prompt_tokens))
        return cls(always, causal)


class Attention(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.q_dim)
        self.k_proj = nn.Linear(c.hidden_size, c.kv_dim)
        self.v_proj = nn.Linear(c.hidden_size, c.kv_dim)
        self.o_proj = nn.Linear(c.q_dim, c.hidden_size, bias=False)
        self.dms_gate: nn.Linear | None = None

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dms: DmsMask | None,
                keys: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention output [B, T, H], and the soft keep probabilities [B, T, kv_heads] when ``dms``; ``keys``
        [B, T] (``Prompts.readable``) hides the pads."""
        c = self.c
        batch, tokens, _ = h.shape
        q = self.q_proj(h).view(batch, tokens, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(batch, tokens, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(batch, tokens, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        group = c.num_attention_heads // c.num_key_value_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # query head h reads h // group
        keep_soft = None
        if dms is None and keys is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif dms is None:
            causal = torch.ones(tokens, tokens, dtype=torch.bool).tril()
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal & keys[:, None, None, :])
        else:
            alpha = self.dms_gate(h)  # [B, T, kv_heads] eviction logits
            keep_soft = torch.sigmoid(-alpha)
            keep = straight_through(keep_soft, alpha < 0).repeat_interleave(group, dim=2)  # [B, T, Hq]
            readable = torch.where(dms.always, torch.ones(()), keep.transpose(1, 2)[:, :, None, :])
            readable = readable * dms.causal  # [B, Hq, T(query), T(key)]
            if keys is not None:
                readable = readable * keys[:, None, None, :]
            scores = (q @ k.transpose(-1, -2)) / c.head_dim ** 0.5
            weights = torch.exp(scores - scores.amax(-1, keepdim=True).detach()) * readable
            out = (weights / weights.sum(-1, keepdim=True)) @ v
        return self.o_proj(out.transpose(1, 2).reshape(batch, tokens, c.q_dim)), keep_soft


class MLP(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, dms, keys):
        attn, keep = self.self_attn(self.input_layernorm(x), cos, sin, dms, keys)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), keep


class Decoder(nn.Module):
    """HuggingFace's ``Qwen2Model``: token embeddings, layers, final norm."""

    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x: torch.Tensor, dms: DmsMask | None = None, prompts: Prompts | None = None
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Final-norm hidden states [B, T, H] of input embeddings x, and the dms gates' soft keep
        probabilities per layer (empty without ``dms``). Positions 0..T-1, or where ``prompts`` (the
        first ``prompts.width`` of x) put them."""
        total = x.shape[1]
        positions = torch.arange(total) if prompts is None else prompts.positions(total)
        keys = None if prompts is None else prompts.readable(total)
        cos, sin = rope_tables(self.c.head_dim, self.c.rope_theta, positions)
        keeps = []
        for layer in self.layers:
            x, keep = layer(x, cos, sin, dms, keys)
            if keep is not None:
                keeps.append(keep)
        return self.norm(x), keeps


class FrameEncoder(nn.Module):
    """``model/vision.py``'s encoder on frames already at the model's image size: [..., S, S, 3] uint8
    -> [..., tokens_per_frame, H]."""

    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.v = c.vision
        self.patch_proj = nn.Linear(self.v.patch_dim, c.hidden_size)
        self.pos_embed = nn.Parameter(torch.zeros(self.v.tokens_per_frame, c.hidden_size))
        self.register_buffer("mean", torch.tensor(self.v.mean) * 255.0, persistent=False)
        self.register_buffer("std", torch.tensor(self.v.std) * 255.0, persistent=False)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        v = self.v
        lead = frames.shape[:-3]
        pixels = (frames.float() - self.mean) / self.std
        grid, patch = v.pool_grid, v.patch_size
        per_cell = v.image_size // patch // grid
        cells = pixels.reshape(-1, grid, per_cell, patch, grid, per_cell, patch, 3).mean(dim=(2, 5))
        cells = cells.permute(0, 1, 3, 2, 4, 5).reshape(*lead, v.tokens_per_frame, v.patch_dim)
        return self.patch_proj(cells) + self.pos_embed


def smooth_patch_filters(hidden: int, patch: int, blur_px: float = 2.5, std: float = 0.02) -> torch.Tensor:
    """[hidden, patch * patch * 3] random filters, blurred over the tile (rows in (row, column, channel)
    order, as the encoder flattens a tile). With white-noise filters a small object's embedding is an
    unrelated random vector at every pixel offset, so where it sits in its patch must be memorised
    offset by offset (a 4-pixel robot took >1,000 steps to be found at all); smooth filters make the
    embedding a smooth function of the offset, which the decoder reads off like a coordinate."""
    noise = torch.randn(hidden * 3, 1, patch, patch)
    radius = int(2 * blur_px)
    taps = torch.exp(-0.5 * (torch.arange(-radius, radius + 1, dtype=torch.float32) / blur_px) ** 2)
    taps = (taps / taps.sum()).view(1, 1, 1, -1)
    blurred = F.conv2d(F.pad(noise, (radius, radius, 0, 0), mode="circular"), taps)
    blurred = F.conv2d(F.pad(blurred, (0, 0, radius, radius), mode="circular"), taps.transpose(2, 3))
    filters = blurred.view(hidden, 3, patch, patch).permute(0, 2, 3, 1).reshape(hidden, -1)
    return filters / filters.std() * std


def grid_position_code(grid: int, hidden: int, scale: float = 0.5) -> torch.Tensor:
    """[grid^2, hidden] 2-D sine-cosine code of each token's (row, column), as ViT-style encoders start
    from: neighbouring cells get similar codes, and the code is as strong as a frame token's content
    (a random N(0, 0.02) start leaves position ~10x weaker, and attention cannot tell cells apart)."""
    quarter = hidden // 4
    frequencies = 1.0 / (grid ** (torch.arange(quarter, dtype=torch.float32) / quarter)) * torch.pi / 2
    row, col = torch.meshgrid(torch.arange(grid, dtype=torch.float32), torch.arange(grid, dtype=torch.float32),
                              indexing="ij")
    parts = [f(axis.reshape(-1, 1) * frequencies) for axis in (row, col) for f in (torch.sin, torch.cos)]
    code = torch.cat(parts, dim=1)
    return F.pad(code, (0, hidden - code.shape[1])) * scale


FastWeightState = tuple[torch.Tensor, torch.Tensor]  # aura's W [B, d_v, d_k] and b [B, d_v]


class AuraMemory(nn.Module):
    """``memory/aura.py``'s projections and learned gate in its ``hidden`` layout: queries from a frame's
    encoder tokens concatenated, keys and values from the decoder's final hidden state at the frame's last
    token. The fast weights are stepped frame by frame (``read`` before the frame's forward, ``write``
    after it), so training unrolls the decoder through time as the engine runs it."""

    def __init__(self, query_size: int, hidden: int, d_k: int, d_v: int) -> None:
        super().__init__()
        self.k_proj = nn.Linear(hidden, d_k, bias=False)
        self.q_proj = nn.Linear(query_size, d_k, bias=False)
        self.v_proj = nn.Linear(hidden, d_v, bias=False)
        self.out_proj = nn.Linear(d_v, hidden, bias=False)
        self.gate = nn.Linear(d_k + d_v, 1)

    def empty(self, batch: int) -> FastWeightState:
        """The fast weights (W [B, d_v, d_k], b [B, d_v]) of an empty memory."""
        d_v, d_k = self.v_proj.out_features, self.k_proj.out_features
        return self.out_proj.weight.new_zeros(batch, d_v, d_k), self.out_proj.weight.new_zeros(batch, d_v)

    def read(self, state: FastWeightState, tokens: torch.Tensor) -> torch.Tensor:
        """The memory token [B, H] a frame with encoder tokens [B, T, H] reads: W_out (W q + b)."""
        weights, bias = state
        q = F.normalize(self.q_proj(tokens.flatten(-2)), dim=-1)
        return self.out_proj(torch.einsum("bvk,bk->bv", weights, q) + bias)

    def write(self, state: FastWeightState, hidden: torch.Tensor, beta: float, forced: torch.Tensor | None = None
              ) -> tuple[FastWeightState, torch.Tensor, torch.Tensor]:
        """(the fast weights after the frame whose last hidden state is ``hidden`` [B, H], the write decisions
        [B], hard forward and soft backward, and the gate's logits [B]); ``forced`` [B] (0 or 1) replaces the
        gate's decisions where given (the logits stay the gate's: what a write label trains)."""
        weights, bias = state
        k = F.normalize(self.k_proj(hidden), dim=-1)
        error = self.v_proj(hidden) - (torch.einsum("bvk,bk->bv", weights, k) + bias)
        logit = self.gate(torch.cat([k, error], dim=-1))[:, 0]
        write = straight_through(torch.sigmoid(logit), logit > 0) if forced is None else forced
        step = beta * write[:, None] * error
        return (weights + step[:, :, None] * k[:, None, :], bias + step), write, logit


class ChunkHead(nn.Module):
    """The engine's ``mlp`` action head (``model/action_head.py``): one hidden layer of ``mlp_hidden`` units with
    exact GELU, then H x dof pre-activations (action i's dimension d at row i * dof + d)."""

    def __init__(self, hidden: int, mlp_hidden: int, outputs: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, mlp_hidden)
        self.fc2 = nn.Linear(mlp_hidden, outputs)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(h)))


def action_head(c: ModelConfig) -> nn.Module:
    """The head ``c.action`` names, its parameters under the checkpoint's names (``action_head.weight`` /
    ``.bias``, or ``action_head.fc1.*`` and ``.fc2.*``)."""
    action = c.action
    if action.head == "linear":
        return nn.Linear(c.hidden_size, action.dof)
    if action.head == "mlp":
        return ChunkHead(c.hidden_size, action.mlp_hidden, action.chunk * action.dof)
    raise ValueError(f"training fits the continuous 'linear' and 'mlp' action heads; this config asks for "
                     f"{action.head!r}")


TRAINING_ONLY = ("where_head.", "memory_goal_head.")  # parameter prefixes the checkpoint does not carry


class VlaModel(nn.Module):
    """Decoder + frame encoder (+ state token) + action head (``linear`` or ``mlp``), aura memory and dms gates.

    ``memory_goal_head`` (training only too) regresses the goal's position from aura's memory token:
    privileged supervision of what the memory holds (``AuraSpec.memory_goal``).

    ``where_head`` is for training only and is not exported: from the same hidden state as the
    action it regresses where the robot and the goal are (the simulator's privileged state). The
    action needs both, and without this direct signal the decoder first learns to find the cued
    goal and heads there from the image centre for hundreds of steps before it looks for the robot.
    """

    def __init__(self, c: ModelConfig, aura_dim: int) -> None:
        super().__init__()
        self.c = c
        self.model = Decoder(c)
        self.vision = FrameEncoder(c)
        self.state_proj = None if c.state is None else nn.Linear(c.state.dim, c.hidden_size)
        self.action_head = action_head(c)
        self.where_head = nn.Linear(c.hidden_size, 4)
        self.aura = AuraMemory(c.observation_tokens * c.hidden_size, c.hidden_size, aura_dim, aura_dim)
        for layer in self.model.layers:
            layer.self_attn.dms_gate = nn.Linear(c.hidden_size, c.num_key_value_heads)
        self.memory_goal_head = nn.Linear(c.hidden_size, 2)
        self.blind = False
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """HF's initialisation (N(0, 0.02), zero biases, unit norms); dms gates start at keep-everything."""
        for name, param in self.named_parameters():
            if name.startswith("memory_goal_head."):  # its own draws: the other tensors stay seeded as before
                # not zero: with aura's read-out starting at zero too, neither would get a gradient
                with torch.no_grad():
                    param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(0)) * 0.02)
            elif name.endswith("norm.weight"):
                nn.init.ones_(param)
            elif name.endswith("bias"):
                nn.init.zeros_(param)
            else:
                nn.init.normal_(param, std=0.02)
        for layer in self.model.layers:
            nn.init.constant_(layer.self_attn.dms_gate.bias, -2.0)  # alpha < 0: keep, as DMS starts
        # The memory token starts at zero, so the frozen decoder is first left undisturbed and the gate
        # open: with a random read-out, every write only added noise, and the gate learned to never
        # write (a collapse it cannot leave: the sigmoid is flat there) before the read-out was useful.
        nn.init.zeros_(self.aura.out_proj.weight)
        nn.init.constant_(self.aura.gate.bias, 2.0)
        with torch.no_grad():
            self.vision.pos_embed.copy_(grid_position_code(self.c.vision.pool_grid, self.c.hidden_size))
            self.vision.patch_proj.weight.copy_(smooth_patch_filters(self.c.hidden_size, self.c.vision.patch_size))

    

    def close_camera(self) -> None:
        """Hold the frame encoder's pixel weights at zero from now on (``TrainSpec.blind``): every frame then gives
        the same tokens (the patch bias plus the position code), in training and in the engine that loads the
        checkpoint, so the model acts on its prompt and the robot's state alone, in the camera model's format."""
        with torch.no_grad():
            self.vision.patch_proj.weight.zero_()
        self.vision.patch_proj.weight.requires_grad_(False)
        self.blind = True

    def prompt_embeddings(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(prompt_ids)

    def observation_tokens(self, frames: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """[..., observation_tokens, H]: the frame's encoder tokens [..., S, S, 3], then, when the model reads
        the robot's state, the token of ``states`` [..., dim] (raw values, normalised here with the config's
        statistics, as ``model/state_token.py`` does)."""
        tokens = self.vision(frames)
        if self.state_proj is None:
            return tokens
        state = self.c.state
        mean = torch.tensor(state.mean or (0.0,) * state.dim, dtype=torch.float32)
        std = torch.tensor(state.std or (1.0,) * state.dim, dtype=torch.float32)
        return torch.cat([tokens, self.state_proj((states - mean) / std)[..., None, :]], dim=-2)

    def actions(self, hidden: torch.Tensor) -> torch.Tensor:
        """Chunks [..., H, dof] of normalised actions in [-1, 1] from final-norm hidden states [..., hidden] (H = 1
        for the linear head)."""
        out = torch.tanh(self.action_head(hidden))
        return out.reshape(*out.shape[:-1], self.c.action.chunk, self.c.action.dof)

    def exported_state(self) -> dict[str, torch.Tensor]:
        """Every tensor the checkpoint carries (all but the training-only heads)."""
        return {name: t for name, t in self.state_dict().items() if not name.startswith(TRAINING_ONLY)}

    def decoder_parameters(self) -> list[nn.Parameter]:
        """Everything the behaviour-cloning stage trains: decoder, frame encoder, state projection, action head."""
        decoder = [p for name, p in self.model.named_parameters() if ".dms_gate." not in name]
        state = [] if self.state_proj is None else list(self.state_proj.parameters())
        closed = self.vision.patch_proj.weight if self.blind else None  # ``close_camera``: never trained
        vision = [p for p in self.vision.parameters() if p is not closed]
        return [*decoder, *vision, *state, *self.action_head.parameters()]

    def dms_parameters(self) -> list[nn.Parameter]:
        return [p for layer in self.model.layers for p in layer.self_attn.dms_gate.parameters()]
