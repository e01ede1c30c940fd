"""Greedy generation with a static KV cache: batched prefill, then one-token decode steps.

Per run (``Engine.generate``): reset the cache, prefill ``concurrency`` prompts of
``input_len`` tokens (the first output token comes from the prefill's last logits), then
``output_len - 1`` decode steps, each feeding the previous token. Shapes never change, so a
compiled decode step is one static graph (with ``mode="max-autotune"``, a CUDA graph).

The KV cache is transformers' ``StaticCache`` (5.x API): each layer keeps a
``cumulative_length`` tensor at a fixed address that the model reads to place new keys
(``index_copy_``) and derive positions and the causal mask, and bumps in place. That
tensor plays the role of a ``cache_position`` input: it lives in the cache, so a CUDA graph
replay advances it without any host-side bookkeeping. Unwritten slots (zeros) sit beyond
the current position and the causal mask hides them.

Timing (``time.perf_counter`` around each phase, the device synchronized before and after):
prefill, decode and the first, compiling run (``warm``) are recorded separately; steady-state
figures come from later runs only.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

# Decode steps of the compiling run: CUDA-graph trees warm up on the first replay of a graph and
# record it on the second, so three steps leave the decode graph recorded and replayed once.
WARM_STEPS = 3


def new_cache(model: torch.nn.Module, batch: int, max_len: int):
    """A StaticCache for ``batch`` sequences of up to ``max_len`` tokens, allocated now (not on
    first use) so its tensors are marked static before anything is compiled."""
    from transformers import StaticCache

    config = model.config
    cache = StaticCache(config=config, max_cache_len=max_len)
    param = next(model.parameters())
    cache.early_initialization(batch, config.num_key_value_heads, config.head_dim, param.dtype, param.device)
    return cache


def prefill_step(model, cache, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(next token ids (B, 1), last-position logits (B, vocab)) after writing ``ids`` into ``cache``."""
    logits = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1, :]
    return logits.argmax(dim=-1, keepdim=True), logits


def decode_step(model, cache, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence; a separate function from ``prefill_step`` so each gets its own
    compiled code (and compile mode) without one's guards evicting the other's."""
    logits = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1, :]
    return logits.argmax(dim=-1, keepdim=True), logits


@dataclass
class Generation:
    tokens: torch.Tensor                 # (B, output_len) int64, on the model's device
    prefill_s: float
    decode_s: float
    logits: list[torch.Tensor] = field(default_factory=list)  # first captured steps, float32 on CPU

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Engine:
    """Generation for one model, one cache and one batch size.

    ``compile_mode`` None runs eagerly; otherwise prefill compiles with ``prefill_mode`` (default:
    the same mode without CUDA graphs; ``compile_prefill=False`` keeps it eager, halving the
    autotuning) and decode with ``compile_mode``. Compilation is lazy: the
    first ``generate`` compiles (and autotunes), so call it inside whatever Inductor config
    patch the side needs.
    """

    def __init__(self, model: torch.nn.Module, cache, batch: int, input_len: int, output_len: int,
                 compile_mode: str | None = None, prefill_mode: str | None = None, fullgraph: bool = False,
                 compile_prefill: bool = True):
        if output_len < 1 or input_len < 1:
            raise ValueError(f"input_len and output_len must be positive, got {input_len}, {output_len}")
        self.model, self.cache = model, cache
        self.batch, self.input_len, self.output_len = batch, input_len, output_len
        self.device = next(model.parameters()).device
        self.cudagraphs = compile_mode is not None and "no-cudagraphs" not in compile_mode and \
            self.device.type == "cuda"
        self._prefill: Callable = prefill_step
        self._decode: Callable = decode_step
        if compile_mode is not None:
            if prefill_mode is None:  # a prefill runs once per generation: no CUDA graph to amortize
                prefill_mode = "max-autotune-no-cudagraphs" if compile_mode == "max-autotune" else compile_mode
            if compile_prefill:
                self._prefill = torch.compile(prefill_step, mode=prefill_mode, dynamic=False, fullgraph=fullgraph)
            self._decode = torch.compile(decode_step, mode=compile_mode, dynamic=False, fullgraph=fullgraph)
        self._ids = torch.empty(batch, 1, dtype=torch.long, device=self.device)

    def generate(self, prompts: torch.Tensor, steps: int | None = None, capture: int = 0) -> Generation:
        """Greedy-generate ``steps`` tokens (default ``output_len``) per prompt; ``capture`` > 0
        keeps the logits of the prefill and the first ``capture - 1`` decode steps (costs a copy
        to the host each: use it on an untimed run)."""
        steps = self.output_len if steps is None else steps
        if tuple(prompts.shape) != (self.batch, self.input_len):
            raise ValueError(f"prompts must be ({self.batch}, {self.input_len}), got {tuple(prompts.shape)}")
        if not 1 <= steps <= self.output_len:
            raise ValueError(f"steps must be in [1, {self.output_len}], got {steps}")
        self.cache.reset()
        tokens = torch.empty(self.batch, steps, dtype=torch.long, device=self.device)
        captured: list[torch.Tensor] = []
        prompts = prompts.to(self.device)
        _sync(self.device)
        start = time.perf_counter()
        with torch.inference_mode():
            nxt, logits = self._prefill(self.model, self.cache, prompts)
            tokens[:, 0] = nxt[:, 0]
            self._ids.copy_(nxt)
            if capture > 0:
                captured.append(logits.float().cpu())
            _sync(self.device)
            prefill_done = time.perf_counter()
            for i in range(1, steps):
                nxt, logits = self.decode_once()
                tokens[:, i] = nxt[:, 0]
                if i < capture:
                    captured.append(logits.float().cpu())
            _sync(self.device)
        end = time.perf_counter()
        return Generation(tokens, prefill_done - start, end - prefill_done, captured)

    def decode_once(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step from the cache's current position, feeding the last token back (call
        under inference mode, after ``generate`` has prefilled)."""
        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        nxt, logits = self._decode(self.model, self.cache, self._ids)
        self._ids.copy_(nxt)  # read the graph's output before the next replay overwrites it
        return nxt, logits


def reference_generate(model: torch.nn.Module, prompts: torch.Tensor,
                       steps: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Greedy generation without a cache: every step recomputes the whole sequence. The check
    on the engine's cache indexing. Returns (tokens (B, steps), per-step last logits, float32 CPU)."""
    seq = prompts.clone()
    logits_seen = []
    with torch.inference_mode():
        for _ in range(steps):
            logits = model(input_ids=seq, use_cache=False).logits[:, -1, :]
            logits_seen.append(logits.float().cpu())
            seq = torch.cat([seq, logits.argmax(dim=-1, keepdim=True)], dim=1)
    return seq[:, prompts.shape[1]:], logits_seen
