"""Shell: continuous batching of one generating replica, on the callers' threads.

Every caller of ``DecodeLoop.run`` queues its sequence; one caller at a time is the
*driver* and runs steps for everyone. A step is a boundary: waiting sequences whose KV
reservation fits join (prefilled together in one left-padded forward, then merged into the
batch), every sequence
in the batch decodes one token together, finished or cancelled ones leave and free their
rows. When the driver's own sequence ends it hands the role to a waiting caller (none of
them ever needs a thread of its own), so nobody waits for strangers' tokens.

KV cache: one batched transformers ``DynamicCache``, ragged sequences left-padded (each
row's padding masked, its positions its own). A sequence reserves ``(prompt + max_tokens)
x kv_bytes_per_token`` of the replica's KV budget when it joins and frees it when it
leaves; a sequence that does not fit waits for the next boundary. The budget is what the
replica reserved beside its weights (``kv.py``); the cache tensors themselves are ordinary
torch allocations on the replica's home device, bounded by that reservation.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from arl_tangram.managers.gpu.generate import (
    GenerateRequest,
    choose_token,
    logprob_entry,
    make_generator,
)
from arl_tangram.managers.gpu.service import LoadedModel

EventSink = Callable[[dict[str, Any]], None]
_POLL_S = 0.05  # a waiting caller re-checks its cancel flag this often


@dataclass(eq=False)
class _Sequence:
    request: GenerateRequest
    on_event: EventSink | None = None
    cancel: threading.Event | None = None
    generator: torch.Generator | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    text: str = ""
    sent_chars: int = 0
    pending: int | None = None  # chosen, not yet fed to the model
    finish_reason: str | None = None
    error: BaseException | None = None
    reserved_bytes: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    def result(self) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        return {
            "text": self.text, "token_ids": list(self.token_ids), "finish_reason": self.finish_reason,
            "prompt_tokens": len(self.request.prompt_ids), "completion_tokens": len(self.token_ids),
            "logprobs": self.logprobs if self.request.logprobs else None,
        }  # fmt: skip


class DecodeLoop:
    """Continuous batching for one replica's module. Thread-safe; no thread of its own."""

    def __init__(
        self, model: LoadedModel, device: torch.device, max_batch: int, kv_budget_bytes: int,
        kv_bytes_per_token: int, closed: threading.Event | None = None,
    ) -> None:  # fmt: skip
        self.model = model
        self.device = device
        self.max_batch = max_batch
        self.kv_budget_bytes = kv_budget_bytes
        self.kv_bytes_per_token = kv_bytes_per_token
        self._closed = closed  # the manager closing cancels every sequence
        self._cond = threading.Condition()
        self._waiting: collections.deque[_Sequence] = collections.deque()
        self._active: list[_Sequence] = []  # row order of the batched cache
        self._reserved_bytes = 0
        self._driving = False
        self._cache: Any = None  # DynamicCache of the active rows (driver only)
        self._pads: list[int] = []  # left padding of each active row (driver only)
        self.num_steps = 0

    # -- callers -------------------------------------------------------------------------
    def run(
        self, request: GenerateRequest, on_event: EventSink | None = None,
        cancel: threading.Event | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Generate one completion (blocking); batched with every concurrent caller."""
        seq = _Sequence(request, on_event, cancel, make_generator(request))
        with self._cond:
            self._waiting.append(seq)
            while not seq.finished:
                if not self._driving:
                    self._driving = True
                    break
                if self._cancelled(seq) and seq in self._waiting:
                    self._waiting.remove(seq)
                    self._end(seq, "cancelled")
                    break
                self._cond.wait(_POLL_S)
        if not seq.finished:
            self._drive(seq)
        return seq.result()

    def run_batch(self, requests: list[GenerateRequest]) -> list[Any]:
        """Generate all of ``requests`` together on this thread (a static batch)."""
        seqs = [_Sequence(r, None, None, make_generator(r)) for r in requests]
        with self._cond:
            self._waiting.extend(seqs)
            while self._driving:
                self._cond.wait(_POLL_S)
            self._driving = True
        self._drive(None)
        out: list[Any] = []
        for seq in seqs:
            try:
                out.append(seq.result())
            except BaseException as exc:
                out.append(exc)
        return out

    def status(self) -> dict[str, int]:
        """Sequences batched and waiting, KV bytes reserved and held by the cache now."""
        with self._cond:
            in_use = 0
            if self._cache is not None:
                in_use = sum(t.nbytes for layer in self._cache.layers for t in (layer.keys, layer.values) if t is not None)
            return {
                "active": len(self._active), "waiting": len(self._waiting), "steps": self.num_steps,
                "kv_reserved_bytes": self._reserved_bytes, "kv_bytes_in_use": int(in_use),
                "kv_budget_bytes": self.kv_budget_bytes,
            }  # fmt: skip

    # -- the driver ----------------------------------------------------------------------
    def _drive(self, own: _Sequence | None) -> None:
        while True:
            with self._cond:
                joining = self._boundary()
                others = bool(self._active or self._waiting or joining)
                if (own is not None and own.finished and others) or not others:
                    self._driving = False  # hand over (or stop): a waiting caller takes it
                    self._waiting.extendleft(reversed(joining))
                    for seq in joining:
                        self._release(seq)
                    self._cond.notify_all()
                    return
            try:
                self._step(joining)
            except BaseException as exc:  # the step failed: every sequence in it sees why
                with self._cond:
                    for seq in [*self._active, *joining]:
                        seq.error = exc
                        self._release(seq)
                    self._active, self._cache, self._pads = [], None, []
                    self._cond.notify_all()

    def _boundary(self) -> list[_Sequence]:
        """Under the lock: cancelled sequences leave; waiting ones that fit are reserved."""
        for seq in [s for s in self._active if self._cancelled(s)]:
            self._end(seq, "cancelled")
        self._drop_finished()
        for seq in [s for s in self._waiting if self._cancelled(s)]:
            self._waiting.remove(seq)
            self._end(seq, "cancelled")
        joining: list[_Sequence] = []
        while self._waiting and len(self._active) + len(joining) < self.max_batch:
            need = self._waiting[0].request.max_context_tokens * self.kv_bytes_per_token
            if self._reserved_bytes + need > self.kv_budget_bytes and (self._active or joining):
                break  # waits for rows to leave (a lone sequence always fits: parse checks)
            seq = self._waiting.popleft()
            seq.reserved_bytes = need
            self._reserved_bytes += need
            joining.append(seq)
        return joining

    def _cancelled(self, seq: _Sequence) -> bool:
        if self._closed is not None and self._closed.is_set():
            return True
        return seq.cancel is not None and seq.cancel.is_set()

    def _drop_finished(self) -> None:
        keep = [i for i, s in enumerate(self._active) if not s.finished]
        if len(keep) == len(self._active):
            return
        for seq in self._active:
            if seq.finished:
                self._release(seq)
        self._active = [self._active[i] for i in keep]
        self._pads = [self._pads[i] for i in keep]
        if not keep:
            self._cache = None
            return
        trim = min(self._pads)
        index = torch.tensor(keep, device=self._cache.layers[0].keys.device)
        layers = [(c.keys.index_select(0, index.to(c.keys.device))[:, :, trim:],
                   c.values.index_select(0, index.to(c.values.device))[:, :, trim:]) for c in self._cache.layers]  # fmt: skip
        self._pads = [p - trim for p in self._pads]
        self._cache = self._new_cache(layers)

    def _release(self, seq: _Sequence) -> None:
        self._reserved_bytes -= seq.reserved_bytes
        seq.reserved_bytes = 0

    def _end(self, seq: _Sequence, reason: str) -> None:
        seq.finish_reason = reason
        self._release(seq)
        self._cond.notify_all()

    # -- one step (no lock held; only the driver touches the cache) ----------------------
    def _step(self, joining: list[_Sequence]) -> None:
        module = self.model.module
        if self._active:
            rows = len(self._active)
            length = self._cache.get_seq_length()
            ids = torch.tensor([[s.pending] for s in self._active], device=self.device)
            mask = torch.ones((rows, length + 1), dtype=torch.long)
            for row, pad in enumerate(self._pads):
                mask[row, :pad] = 0
            positions = torch.tensor([[length - pad] for pad in self._pads], device=self.device)
            out = module(
                input_ids=ids, attention_mask=mask.to(self.device), position_ids=positions,
                past_key_values=self._cache, use_cache=True,
            )  # fmt: skip
            logits = out.logits[:, -1].float().cpu()
            for row, seq in enumerate(self._active):
                self._advance(seq, logits[row])
        prefilled = self._prefill(joining) if joining else None
        self.num_steps += 1
        with self._cond:
            self._merge(prefilled)
            self._drop_finished()
            self._cond.notify_all()

    def _prefill(self, joining: list[_Sequence]) -> tuple[list[_Sequence], Any, list[int]]:
        """All joiners' prompts in one left-padded forward: their first tokens and cache."""
        lengths = [len(s.request.prompt_ids) for s in joining]
        width = max(lengths)
        ids = torch.full((len(joining), width), self.model.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(joining), width), dtype=torch.long)
        for row, seq in enumerate(joining):
            ids[row, width - lengths[row] :] = torch.tensor(seq.request.prompt_ids)
            mask[row, width - lengths[row] :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = self._new_cache([])
        out = self.model.module(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device), past_key_values=cache, use_cache=True,
            logits_to_keep=1,  # only the last position's logits: the output layer is the widest
        )  # fmt: skip
        logits = out.logits[:, -1].float().cpu()
        for row, seq in enumerate(joining):
            self._advance(seq, logits[row])
        return joining, cache, [width - n for n in lengths]

    def _merge(self, prefilled: tuple[list[_Sequence], Any, list[int]] | None) -> None:
        if prefilled is None:
            return
        joined, joined_cache, joined_pads = prefilled
        parts = ([(self._cache, self._pads)] if self._active else []) + [(joined_cache, joined_pads)]
        length = max(c.get_seq_length() for c, _ in parts)
        layers = []
        for index in range(len(parts[0][0].layers)):
            keys = [_left_pad(c.layers[index].keys, length) for c, _ in parts]
            values = [_left_pad(c.layers[index].values, length) for c, _ in parts]
            layers.append((torch.cat(keys, dim=0), torch.cat(values, dim=0)))
        self._pads = [p + length - c.get_seq_length() for c, pads in parts for p in pads]
        self._active = self._active + joined
        self._cache = self._new_cache(layers)

    def _new_cache(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        from transformers import DynamicCache

        config = getattr(self.model.module, "config", None)
        return DynamicCache(ddp_cache_data=layers or None, config=config)

    def _advance(self, seq: _Sequence, logits: torch.Tensor) -> None:
        """Choose ``seq``'s next token from its logits row; end it on EOS, a stop or length."""
        request = seq.request
        token = choose_token(logits, request, seq.generator)
        if request.logprobs:
            seq.logprobs.append(logprob_entry(logits, token, request.top_logprobs, self._decode))
        if token == request.eos_token_id and not request.ignore_eos:
            self._finish(seq, "stop")
            return
        seq.token_ids.append(token)
        seq.pending = token
        full = self._decode(seq.token_ids) if self.model.tokenizer is not None else ""
        hits = [full.find(s) for s in request.stop if s in full]
        if hits:
            seq.text = full[: min(hits)]
            self._finish(seq, "stop")
            return
        seq.text = full
        if len(seq.token_ids) >= request.max_tokens:
            self._finish(seq, "length")
            return
        hold = max((len(s) for s in request.stop), default=1) - 1
        safe = len(full) - hold
        while safe > seq.sent_chars and full[safe - 1] == "\ufffd":
            safe -= 1  # an incomplete UTF-8 sequence: its character comes with the next token
        self._emit(seq, safe, token)

    def _finish(self, seq: _Sequence, reason: str) -> None:
        self._emit(seq, len(seq.text), seq.token_ids[-1] if seq.token_ids else None, reason)
        seq.finish_reason = reason

    def _emit(self, seq: _Sequence, upto: int, token: int | None, reason: str | None = None) -> None:
        if seq.on_event is None:
            return
        delta = seq.text[seq.sent_chars : upto] if upto > seq.sent_chars else ""
        seq.sent_chars = max(seq.sent_chars, upto)
        last = seq.logprobs[-1] if seq.request.logprobs and seq.logprobs else None
        seq.on_event({"delta": delta, "token_id": token, "logprobs": last, "finish_reason": reason})

    def _decode(self, ids: list[int]) -> str:
        tokenizer = self.model.tokenizer
        if tokenizer is None:
            return ""
        with self.model.tokenizer_lock:
            return str(tokenizer.decode(ids, skip_special_tokens=True))


def _left_pad(tensor: torch.Tensor, length: int) -> torch.Tensor:
    """``[B, H, L, D]`` left-padded with zeros to ``length`` along L (masked rows)."""
    missing = length - tensor.shape[2]
    if missing <= 0:
        return tensor
    pad = tensor.new_zeros((tensor.shape[0], tensor.shape[1], missing, tensor.shape[3]))
    return torch.cat([pad, tensor], dim=2)
