"""A small torch causal sequence model: prompt code → GRU over the response → normalised features → linear head.

    c      = (1/√P) Σ_p E_p[x_p]                                   prompt code (position-aware token embeddings)
    h_0    = tanh(W_0 c)                                            GRU state initialised from the prompt
    h_t    = GRU(h_{t−1}, [E[y_{t−1}]; Q_t; c]),  y_0 = BOS         Q_t: response-position embedding
    φ_t    = LayerNorm([h_t; c; Q_t; c ⊙ S_t])                      S_t: position code of the prompt × position term
    π_θ(y_t | x, y_{<t}) = softmax(s · (W φ_t + b)),   s = logit_scale / √dim φ

Prompt positions p count from the right end of the (left-padded) prompt; padding contributes nothing.  Token id
``i`` means the same symbol in prompt and response (one table ``E``); ``BOS`` has its own row.  ``W``, ``b`` start at
zero, so a fresh model is the uniform policy.  The GRU is causal, so
:class:`~offpolicylab.policies.autoregressive.AutoregressivePolicy` samples and scores through this one function and
the two log-probs agree exactly.

Why this shape (measured under on-policy GRPO on the token MDPs, Adam lr 0.01, 8 prompts × 8 samples; the plain
``GRU(E[x_1 … x_P, BOS, y_1 … y_{T−1}]) → linear`` model plateaued at J = 0.70 / 0.33 / 0.27 on target / arithmetic
/ forking with the entropy collapsed to ≈ 0 within 50 updates):

- *prompt conditioning*: after two prompt tokens went through the GRU the features of different prompts at the same
  response position had cosine ≈ 0.89 — the model barely told prompts apart, so every update for one prompt moved
  all of them the same way and the policy committed to per-position compromises.  The additive prompt code (and
  the product c ⊙ S_t, a separate random feature for every (prompt, position) pair) brings it to ≈ 0.4;
- *output scale*: Adam moves each head weight by ≈ lr per step whatever the gradient's size, so a logit moves by
  up to lr · ‖φ‖₁ ≈ lr · dim φ — a few hundred times the tabular policy's lr per step.  The head is scaled by
  ``logit_scale/√dim φ`` (as in µP's output multiplier) over LayerNorm'd, unit-scale features, so one step moves a
  logit by O(lr · logit_scale · √dim φ) and exploration survives long enough to find the rewarded tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional

from offpolicylab.policies.autoregressive import ModulePolicy


class _PromptGRUCore(nn.Module):
    """The network of the module docstring; ``forward(prompt, prompt_mask, response_inputs) → logits [B, T, V]``."""

    def __init__(self, input_vocab: int, vocab_size: int, response_len: int, max_prompt_len: int, embed_dim: int,
                 hidden_size: int, num_layers: int, logit_scale: float) -> None:
        super().__init__()
        self.input_vocab, self.max_prompt_len, self.num_layers = input_vocab, max_prompt_len, num_layers
        self.token = nn.Embedding(input_vocab, embed_dim)
        self.prompt_code = nn.Embedding(max_prompt_len * input_vocab, hidden_size)
        nn.init.normal_(self.prompt_code.weight)
        self.position = nn.Embedding(response_len, embed_dim)
        self.pair_position = nn.Embedding(response_len, hidden_size)
        self.initial_state = nn.Linear(hidden_size, hidden_size * num_layers)
        self.gru = nn.GRU(2 * embed_dim + hidden_size, hidden_size, num_layers=num_layers, batch_first=True)
        feature_dim = 3 * hidden_size + embed_dim
        self.norm = nn.LayerNorm(feature_dim)
        self.head = nn.Linear(feature_dim, vocab_size)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.output_multiplier = logit_scale / math.sqrt(feature_dim)

    def encode_prompt(self, prompt: Tensor, prompt_mask: Tensor) -> Tensor:
        """c = (1/√P) Σ_p E_p[x_p] over real prompt tokens, p counted from the right end: [B, H]."""
        width = prompt.shape[1]
        from_right = torch.arange(width - 1, -1, -1)
        codes = self.prompt_code(from_right[None, :] * self.input_vocab + prompt)
        real = (prompt_mask > 0).to(codes.dtype)
        length = real.sum(1, keepdim=True).clamp(min=1.0)
        return (codes * real[..., None]).sum(1) / length.sqrt()

    def forward(self, prompt: Tensor, prompt_mask: Tensor, response_inputs: Tensor) -> Tensor:
        code = self.encode_prompt(prompt, prompt_mask)
        steps = torch.arange(response_inputs.shape[1])
        hidden, _ = self.gru(self._step_inputs(response_inputs, steps, code), self._initial_state(code))
        return self._readout(hidden, steps, code)

    def prefix_tree(self, prompt: Tensor, prompt_mask: Tensor, bos: int, vocab_size: int, depth: int) -> Tensor:
        """Logits [B, K, V] after every response prefix of length t < depth (K = Σ_t V^t, base-V order per depth):
        the GRU is stepped once per tree node, each node's state copied to its V children (same modules as
        :meth:`forward`, one position at a time)."""
        code = self.encode_prompt(prompt, prompt_mask)
        batch = code.shape[0]
        state, tokens = self._initial_state(code), torch.full((batch, 1), bos, dtype=torch.long)
        levels = []
        for t in range(depth):
            step = torch.tensor([t])
            hidden, state = self.gru(self._step_inputs(tokens, step, code), state)
            levels.append(self._readout(hidden, step, code).reshape(batch, -1, vocab_size))
            if t + 1 < depth:  # children of node k: k·V + v, v = 0 … V−1
                state, code = state.repeat_interleave(vocab_size, dim=1), code.repeat_interleave(vocab_size, dim=0)
                tokens = torch.arange(vocab_size).repeat(tokens.shape[0])[:, None]
        return torch.cat(levels, dim=1)

    def _step_inputs(self, tokens: Tensor, steps: Tensor, code: Tensor) -> Tensor:
        """GRU inputs [E[y_{t−1}]; Q_t; c] for ``tokens`` [B, W] at positions ``steps`` [W]."""
        batch, width = tokens.shape
        position = self.position(steps)[None].expand(batch, width, -1)
        return torch.cat([self.token(tokens), position, code[:, None].expand(batch, width, -1)], dim=-1)

    def _initial_state(self, code: Tensor) -> Tensor:
        """h_0 = tanh(W_0 c) as [layers, B, H]."""
        state = torch.tanh(self.initial_state(code)).reshape(code.shape[0], self.num_layers, -1)
        return state.transpose(0, 1).contiguous()

    def _readout(self, hidden: Tensor, steps: Tensor, code: Tensor) -> Tensor:
        """s · (W LayerNorm([h_t; c; Q_t; c ⊙ S_t]) + b) for ``hidden`` [B, W, H] at positions ``steps`` [W]."""
        batch, width = hidden.shape[:2]
        code_per_step = code[:, None].expand(batch, width, -1)
        position = self.position(steps)[None].expand(batch, width, -1)
        pair = code_per_step * self.pair_position(steps)[None]
        features = self.norm(torch.cat([hidden, code_per_step, position, pair], dim=-1))
        return self.head(features) * self.output_multiplier


class SequenceModelPolicy(ModulePolicy):
    """GRU policy over prompt + response tokens (see module docstring).

    ``prompt_vocab_size``: number of distinct prompt token ids (defaults to ``vocab_size``).
    ``max_prompt_len``: longest prompt the prompt code accepts.
    ``logit_scale``: output multiplier × √(feature dim); smaller = slower, more exploratory learning under Adam.
    ``seed`` makes the initial weights reproducible (a private generator; global RNG untouched).
    """

    def __init__(self, vocab_size: int, response_len: int, eos_id: int | None = None,
                 prompt_vocab_size: int | None = None, embed_dim: int = 32, hidden_size: int = 64,
                 num_layers: int = 1, sampler_noise_std: float = 0.0, seed: int = 0, max_prompt_len: int = 64,
                 logit_scale: float = 0.4, sampler_precision: str = "fp32") -> None:
        self._init_common(vocab_size, response_len, eos_id, sampler_noise_std, sampler_precision)
        prompt_vocab_size = vocab_size if prompt_vocab_size is None else int(prompt_vocab_size)
        for name, value in (("prompt_vocab_size", prompt_vocab_size), ("embed_dim", embed_dim),
                            ("hidden_size", hidden_size), ("num_layers", num_layers),
                            ("max_prompt_len", max_prompt_len)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not (math.isfinite(logit_scale) and logit_scale > 0):
            raise ValueError(f"logit_scale must be a finite number > 0, got {logit_scale}")
        symbols = max(prompt_vocab_size, self.vocab_size)
        self.pad_token, self.bos_token = symbols, symbols + 1
        self.prompt_vocab_size = prompt_vocab_size
        self.max_prompt_len = int(max_prompt_len)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.model = _PromptGRUCore(symbols + 2, self.vocab_size, self.response_len, self.max_prompt_len,
                                        embed_dim, hidden_size, num_layers, float(logit_scale))

    def response_logits(self, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor,
                        response_ids: Tensor) -> Tensor:
        """Logits [B, T, V] from one GRU pass over [BOS, response[:, :-1]] started from the prompt (no row loop)."""
        batch, width = response_ids.shape
        if width != self.response_len:
            raise ValueError(f"response_ids has {width} positions, the policy has response_len {self.response_len}")
        prompt = self._prompt_tokens(prompt_ids, prompt_mask)
        bos = torch.full((batch, 1), self.bos_token, dtype=torch.long)
        return self.model(prompt, prompt_mask, torch.cat([bos, response_ids[:, :-1]], dim=1))

    def prefix_tree_logits(self, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor) -> Tensor:
        """Logits [N, K, V] after every response prefix (see ``AutoregressivePolicy.prefix_tree_log_probs``), one GRU
        step per distinct prefix: Σ_{t<T} V^t steps per prompt instead of T·V^(T−1)."""
        return self.model.prefix_tree(self._prompt_tokens(prompt_ids, prompt_mask), prompt_mask, self.bos_token,
                                      self.vocab_size, self.response_len)

    def _prompt_tokens(self, prompt_ids: Tensor, prompt_mask: Tensor) -> Tensor:
        if prompt_ids.shape[1] > self.max_prompt_len:
            raise ValueError(f"prompt has {prompt_ids.shape[1]} positions, the policy has max_prompt_len "
                             f"{self.max_prompt_len}")
        return torch.where(prompt_mask > 0, prompt_ids, torch.full_like(prompt_ids, self.pad_token)).long()


Linear = Callable[[Tensor], Tensor]


def unrolled_gru(inputs: Tensor, state: Tensor, input_maps: Sequence[Linear],
                 hidden_maps: Sequence[Linear]) -> tuple[Tensor, Tensor]:
    """``nn.GRU`` (batch first, no dropout) one time step at a time (Cho et al. 2014, arXiv:1406.1078, in PyTorch's
    form; gate rows ordered r, z, n), with layer l's affine maps ``input_maps[l](x) = W_i x + b_i`` and
    ``hidden_maps[l](h) = W_h h + b_h``:

        r_t = σ(W_ir x_t + b_ir + W_hr h_{t−1} + b_hr)
        z_t = σ(W_iz x_t + b_iz + W_hz h_{t−1} + b_hz)
        n_t = tanh(W_in x_t + b_in + r_t ⊙ (W_hn h_{t−1} + b_hn))
        h_t = (1 − z_t) ⊙ n_t + z_t ⊙ h_{t−1}

    ``inputs`` [..., W, in], ``state`` [layers, ..., H] (any leading dims: the stacked policy's [S, b]).  Returns
    (outputs [..., W, H] of the last layer, final states [layers, ..., H]); equal to ``nn.GRU`` within float
    rounding (its fused kernel sums in another order)."""
    layer_input, finals = inputs, []
    for layer, (input_map, hidden_map) in enumerate(zip(input_maps, hidden_maps, strict=True)):
        gates_in, hidden, outputs = input_map(layer_input), state[layer], []
        for t in range(inputs.shape[-2]):
            hidden = gru_cell(gates_in[..., t, :], hidden_map(hidden), hidden)
            outputs.append(hidden)
        layer_input = torch.stack(outputs, dim=-2)
        finals.append(hidden)
    return layer_input, torch.stack(finals)


def gru_cell(gates_in: Tensor, gates_h: Tensor, hidden: Tensor) -> Tensor:
    """h_t of :func:`unrolled_gru` from the affine maps ``gates_in`` = W_i x_t + b_i and ``gates_h`` = W_h h_{t−1} + b_h
    (``[..., 3H]``, gate rows r, z, n) and ``hidden`` = h_{t−1}."""
    size = hidden.shape[-1]
    reset, update = torch.sigmoid(gates_in[..., :2 * size] + gates_h[..., :2 * size]).chunk(2, dim=-1)
    candidate = torch.tanh(gates_in[..., 2 * size:] + reset * gates_h[..., 2 * size:])
    return candidate + update * (hidden - candidate)  # (1 − z) ⊙ n + z ⊙ h


def _same(x: Tensor) -> Tensor:
    """The identity: the first layer's input map, whose gates :meth:`_StackedCore.input_gates` already computed."""
    return x


class _StackedCore(nn.Module):
    """S :class:`_PromptGRUCore` of one architecture with every weight stacked ``[S, ...]`` (batched seeds).  It
    computes the network of the module docstring for S equal consecutive row blocks, block s with weights s: every
    tensor carries a leading member dimension, embeddings are one lookup in the flattened stack, linear maps one
    batched matrix product (``baddbmm``) and the GRU is :func:`unrolled_gru`."""

    def __init__(self, cores: Sequence[_PromptGRUCore]) -> None:
        super().__init__()
        first = cores[0]
        self.size, self.input_vocab, self.num_layers = len(cores), first.input_vocab, first.num_layers
        self.output_multiplier, self.norm_eps = first.output_multiplier, first.norm.eps
        names = [name for name, _ in first.named_parameters()]
        self.weights = nn.ParameterList(
            nn.Parameter(torch.stack([dict(core.named_parameters())[name].detach() for core in cores]))
            for name in names)
        self.w = dict(zip(names, self.weights, strict=True))
        for index, core in enumerate(cores):  # each member's weights become views of its slice (no copy)
            for stacked, param in zip(self.weights, core.parameters(), strict=True):
                param.data = stacked.detach()[index]

    def forward(self, prompt: Tensor, prompt_mask: Tensor, response_inputs: Tensor) -> Tensor:
        code, state = self.start(prompt, prompt_mask)
        (response_inputs,) = self._blocks(response_inputs)
        steps = torch.arange(response_inputs.shape[-1])
        hidden, _ = self._gru(self.input_gates(self.input_parts(code), response_inputs, steps), state)
        logits = self._readout(hidden, steps, code)
        return logits.reshape(-1, *logits.shape[2:])

    def prefix_tree(self, prompt: Tensor, prompt_mask: Tensor, bos: int, vocab_size: int, depth: int) -> Tensor:
        """:meth:`_PromptGRUCore.prefix_tree` of every member on its block, stepping only what differs between the V
        children of a node (node k's children are k·V + v, v = 0 … V−1): the hidden maps W_h h_{t−1} + b_h of every
        layer once per parent (the children share h_{t−1}), the first layer's input gates from
        :meth:`input_parts` (no product per node)."""
        code, state = self.start(prompt, prompt_mask)
        size, batch = code.shape[:2]
        parts = self.input_parts(code)
        logits, state = self.advance(torch.full((size, batch, 1), bos, dtype=torch.long), 0, code, state, parts)
        levels = [logits.reshape(size, batch, -1, vocab_size)]
        tokens, positions, prompts = parts
        for t in range(1, depth):
            parents = state.shape[2] // batch  # V^(t−1) per prompt
            gates = prompts[:, :, None, None] + positions[:, t, None, None, None] + tokens[:, None, None, :vocab_size]
            layer_input = gates.expand(size, batch, parents, vocab_size, -1).reshape(size, -1, gates.shape[-1])
            finals = []
            for layer in range(self.num_layers):
                if layer > 0:
                    layer_input = self._affine(f"gru.weight_ih_l{layer}", f"gru.bias_ih_l{layer}")(layer_input)
                gates_h = self._affine(f"gru.weight_hh_l{layer}", f"gru.bias_hh_l{layer}")(state[layer])
                layer_input = gru_cell(layer_input, gates_h.repeat_interleave(vocab_size, dim=1),
                                       state[layer].repeat_interleave(vocab_size, dim=1))
                finals.append(layer_input)
            state = torch.stack(finals)
            nodes = code[:, :, None].expand(size, batch, parents * vocab_size, -1).reshape(size, -1, code.shape[-1])
            logits = self._readout(layer_input[:, :, None], torch.tensor([t]), nodes)
            levels.append(logits.reshape(size, batch, -1, vocab_size))
        return torch.cat(levels, dim=2).reshape(size * batch, -1, vocab_size)

    def start(self, prompt: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor]:
        """(prompt code c [S, b, H], h_0 [layers, S, b, H]) of ``[S·b, P]`` prompts."""
        code = self._encode_prompt(*self._blocks(prompt, prompt_mask))
        return code, self._initial_state(code)

    def advance(self, tokens: Tensor, t: int, code: Tensor, state: Tensor,
                parts: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """One GRU step at response position ``t`` from ``state`` on the previous ``tokens`` [S, b, 1]: (logits
        [S, b, 1, V], the next state); ``parts``: :meth:`input_parts` of ``code``, computed once per decoding."""
        step = torch.tensor([t])
        hidden, state = self._gru(self.input_gates(parts, tokens, step), state)
        return self._readout(hidden, step, code), state

    def input_parts(self, code: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The first GRU layer's input map split by what each part reads,

            W_i [E[y]; Q_t; c] + b_i  =  W_i^E E[y]  +  W_i^Q Q_t  +  (W_i^c c + b_i),

        as tables: per token id [S, N, 3H], per response position [S, T, 3H], per prompt [S, b, 3H] — a few small
        products instead of one per response token (equal to the whole product within float rounding: the three
        sums are added in another order)."""
        weight, embed = self.w["gru.weight_ih_l0"], self.w["token.weight"].shape[-1]
        tokens = torch.bmm(self.w["token.weight"], weight[:, :, :embed].transpose(1, 2))
        positions = torch.bmm(self.w["position.weight"], weight[:, :, embed:2 * embed].transpose(1, 2))
        prompts = torch.baddbmm(self.w["gru.bias_ih_l0"][:, None], code, weight[:, :, 2 * embed:].transpose(1, 2))
        return tokens, positions, prompts

    def input_gates(self, parts: tuple[Tensor, Tensor, Tensor], ids: Tensor, steps: Tensor) -> Tensor:
        """The first layer's W_i x_t + b_i [S, b, W, 3H] for the previous tokens ``ids`` [S, b, W] at positions
        ``steps`` [W], from :meth:`input_parts`."""
        tokens, positions, prompts = parts
        return prompts[:, :, None] + positions[:, steps][:, None] + self._rows(tokens, ids)

    def _blocks(self, *rows: Tensor) -> list[Tensor]:
        """``[S·b, ...]`` → ``[S, b, ...]``."""
        return [row.reshape(self.size, row.shape[0] // self.size, *row.shape[1:]) for row in rows]

    def _lookup(self, name: str, ids: Tensor) -> Tensor:
        """Rows ``ids`` [S, ...] of each member's embedding table ``name`` [S, N, D] → [S, ..., D]."""
        return self._rows(self.w[name], ids)

    def _rows(self, table: Tensor, ids: Tensor) -> Tensor:
        """Rows ``ids`` [S, ...] of each member's table [S, N, D] → [S, ..., D] (one lookup in the flattened stack)."""
        offsets = (torch.arange(self.size) * table.shape[1]).reshape(-1, *[1] * (ids.dim() - 1))
        return functional.embedding(ids + offsets, table.reshape(-1, table.shape[-1]))

    def _linear(self, name: str, x: Tensor) -> Tensor:
        """W_s x + b_s of each member's linear map ``name`` on ``x`` [S, ..., in] → [S, ..., out]."""
        return self._affine(f"{name}.weight", f"{name}.bias")(x)

    def _encode_prompt(self, prompt: Tensor, prompt_mask: Tensor) -> Tensor:
        width = prompt.shape[-1]
        codes = self._lookup("prompt_code.weight", torch.arange(width - 1, -1, -1) * self.input_vocab + prompt)
        real = (prompt_mask > 0).to(codes.dtype)
        length = real.sum(-1, keepdim=True).clamp(min=1.0)
        return (codes * real[..., None]).sum(-2) / length.sqrt()

    def _initial_state(self, code: Tensor) -> Tensor:
        """[layers, S, b, H]."""
        state = torch.tanh(self._linear("initial_state", code))
        return state.reshape(*code.shape[:2], self.num_layers, -1).permute(2, 0, 1, 3).contiguous()

    def _gru(self, gates: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """:func:`unrolled_gru` from the first layer's input gates ``gates`` [S, b, W, 3H] (:meth:`input_gates`)."""
        layers = range(1, self.num_layers)
        input_maps = [_same, *(self._affine(f"gru.weight_ih_l{k}", f"gru.bias_ih_l{k}") for k in layers)]
        return unrolled_gru(gates, state, input_maps,
                            [self._affine(f"gru.weight_hh_l{k}", f"gru.bias_hh_l{k}") for k in range(self.num_layers)])

    def _affine(self, weight: str, bias: str) -> Linear:
        """x ↦ W_s x + b_s with the stacked tensors ``weight`` [S, out, in] and ``bias`` [S, out]."""
        w, b = self.w[weight].transpose(1, 2), self.w[bias][:, None]

        def apply(x: Tensor) -> Tensor:
            return torch.baddbmm(b, x.reshape(self.size, -1, x.shape[-1]), w).reshape(*x.shape[:-1], -1)

        return apply

    def _readout(self, hidden: Tensor, steps: Tensor, code: Tensor) -> Tensor:
        size, batch, width = hidden.shape[:3]
        code_per_step = code[:, :, None].expand(size, batch, width, -1)
        position = self.w["position.weight"][:, steps][:, None].expand(size, batch, width, -1)
        pair = code_per_step * self.w["pair_position.weight"][:, steps][:, None]
        features = torch.cat([hidden, code_per_step, position, pair], dim=-1)
        features = functional.layer_norm(features, features.shape[-1:], eps=self.norm_eps)
        features = features * self.w["norm.weight"][:, None, None] + self.w["norm.bias"][:, None, None]
        return self._linear("head", features) * self.output_multiplier


class StackedSequenceModelPolicy(SequenceModelPolicy):
    """S :class:`SequenceModelPolicy` of one architecture as one policy (batched seeds): every weight is a stacked
    ``[S, ...]`` tensor, a batch holds S equal consecutive row blocks and block s is answered by member s's weights

        π(y_t | x, y_<t; row in block s) = softmax(s · (W_s φ_t^(s) + b_s)),  φ^(s) the member's network above

    with the GRU recurrence unrolled (:func:`unrolled_gru`) and batched over members by :func:`torch.func.vmap`.  No
    weight is shared, so the gradient of Σ_s loss_s restricted to member s's slice is the gradient of loss_s; each
    member's parameters become views of its slice, so evaluation and checkpoints of a member see the steps."""

    def __init__(self, members: Sequence[SequenceModelPolicy]) -> None:
        first = members[0]
        shapes = [[tuple(p.shape) for p in m.model.parameters()] for m in members]
        keys = [(m.vocab_size, m.response_len, m.eos_id, m.sampler_noise_std, m.pad_token, m.bos_token,
                 m.max_prompt_len, m.model.output_multiplier) for m in members]
        if any(shape != shapes[0] for shape in shapes) or any(key != keys[0] for key in keys):
            raise ValueError("stacked sequence models must share their architecture, vocabulary, eos_id and "
                             "sampler noise")
        if any(m.sampler_precision != "fp32" for m in members):
            raise ValueError(f"batched sequence_model seeds need sampler_precision=fp32, got "
                             f"{first.sampler_precision!r}: the stacked GRU sums in another order than nn.GRU, which "
                             "a reduced-precision sampler turns into different draws; valid: run the seeds "
                             "separately (--seed S), or sampler_precision=fp32")
        self._init_common(first.vocab_size, first.response_len, first.eos_id, first.sampler_noise_std)
        self.pad_token, self.bos_token = first.pad_token, first.bos_token
        self.prompt_vocab_size, self.max_prompt_len, self.size = first.prompt_vocab_size, first.max_prompt_len, \
            len(members)
        self.model = _StackedCore([m.model for m in members])  # type: ignore[assignment]

    def start_decoding(self, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor) -> dict[str, Tensor]:
        """The decoding state: the prompt code, the first layer's input parts (``_StackedCore.input_parts``) and the
        GRU state, advanced one step per :meth:`next_logits`."""
        code, state = self.model.start(self._prompt_tokens(prompt_ids, prompt_mask), prompt_mask)
        return {"code": code, "parts": self.model.input_parts(code), "state": state}

    def next_logits(self, state: dict[str, Tensor], prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor,
                    response_ids: Tensor, t: int) -> Tensor:
        """Logits [S·b, V] of position ``t`` from one GRU step on y_{t−1} (BOS at t = 0): the column ``t`` of
        :meth:`response_logits` within float rounding (one step instead of a pass over the whole buffer)."""
        previous = response_ids[:, t - 1] if t > 0 else torch.full_like(response_ids[:, 0], self.bos_token)
        code = state["code"]
        logits, state["state"] = self.model.advance(previous.reshape(*code.shape[:2], 1), t, code, state["state"],
                                                    state["parts"])
        return logits.reshape(-1, logits.shape[-1])

    def state_dict(self) -> dict[str, Any]:
        raise TypeError("a stacked policy has no state of its own: checkpoint its members")
