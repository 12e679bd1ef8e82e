"""Log-probabilities of chosen tokens without a full-vocabulary log-softmax over the batch.

A causal LM's logits are ``[B, T, V]``; for a 150k vocabulary and 8k tokens per micro-batch that
is 4.9 GB in float32, and autograd keeps it (and the log-softmax) for the backward pass. The
loss only needs one number per *trained* token::

    log pi(y_t | y_<t) = z_t[y_t] - logsumexp(z_t),     z_t = W h_t (+ b)

so :func:`chunked_token_logprobs` computes the output projection for a chunk of positions at a
time, keeps ``logsumexp(z_t)`` (one float per token) and recomputes the chunk's logits in the
backward pass, where ``d log pi / d z_t = onehot(y_t) - softmax(z_t)``. Peak memory is one chunk
of logits instead of the whole batch's, and positions that are not trained (prompt, tool output)
never go through the output projection at all. The entropy of each position's distribution,
``H_t = logsumexp(z_t) - sum_v softmax(z_t)_v z_tv``, comes from the same chunks for free (as a
metric: no gradient).

:class:`PolicyModel` wraps a Hugging Face causal LM so that one ``forward`` (the one FSDP2 hooks)
runs the decoder and the chunked projection.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["chunked_token_logprobs", "PolicyModel"]


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """Autograd function behind :func:`chunked_token_logprobs` (see the module docstring)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        chunk: int,
        with_entropy: bool,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = hidden.shape[0]
        lp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        ent = torch.zeros(n if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            _forward_chunk(hidden[s:e], weight, bias, targets[s:e], scale, lp[s:e], lse[s:e], ent[s:e] if with_entropy else None)
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.chunk, ctx.scale = chunk, scale
        ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx: Any, grad_lp: torch.Tensor, _grad_ent: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        n, chunk = hidden.shape[0], ctx.chunk
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b and bias is not None else None
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            _backward_chunk(hidden[s:e], weight, bias, targets[s:e], lse[s:e], grad_lp[s:e].float(), ctx.scale,
                            grad_h[s:e] if grad_h is not None else None, grad_w, grad_b)
        return (
            grad_h,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if grad_b is not None else None,
            None,
            None,
            None,
            None,
        )


def _forward_chunk(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor, scale: float,
    lp: torch.Tensor, lse: torch.Tensor, ent: torch.Tensor | None,
) -> None:
    """One chunk of the forward pass, written into the views ``lp``, ``lse`` (and ``ent``). A
    function of its own so that the chunk's logits are freed when it returns, before the next
    chunk's are made (a loop variable would keep them alive beside the next chunk's)."""
    z = _logits(hidden, weight, bias, scale)
    lse.copy_(torch.logsumexp(z, dim=-1))
    lp.copy_(z.gather(-1, targets[:, None]).squeeze(-1) - lse)
    if ent is not None:
        p = torch.exp(z - lse[:, None])
        ent.copy_(lse - (p * z).sum(-1))


def _backward_chunk(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor, lse: torch.Tensor,
    g: torch.Tensor, scale: float, grad_h: torch.Tensor | None, grad_w: torch.Tensor | None, grad_b: torch.Tensor | None,
) -> None:
    """One chunk of the backward pass: the chunk's logits recomputed, ``d lp / d z`` times the
    incoming gradient ``g``, added into ``grad_w``/``grad_b`` and written into the view ``grad_h``
    (freed on return, as in :func:`_forward_chunk`)."""
    z = _logits(hidden, weight, bias, scale)
    gz = torch.exp(z - lse[:, None]).mul_(-g[:, None])  # -g * softmax(z)
    del z
    gz.scatter_add_(-1, targets[:, None], g[:, None])  # + g * onehot(y)
    if scale != 1.0:
        gz.mul_(scale)  # z = scale * (W h + b)
    if grad_h is not None:
        grad_h.copy_((gz.to(weight.dtype) @ weight).to(grad_h.dtype))
    if grad_w is not None:
        grad_w.addmm_(gz.t(), hidden.float())
    if grad_b is not None:
        grad_b += gz.sum(0)


def _logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, scale: float = 1.0) -> torch.Tensor:
    """``z = scale * (h W^T (+ b))``: the projection in the parameters' dtype, returned in
    float32 (as transformers does), then scaled (``1 / temperature``)."""
    z = h.to(weight.dtype) @ weight.t()
    if bias is not None:
        z = z + bias
    z = z.float()
    return z * scale if scale != 1.0 else z


def chunked_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    chunk_tokens: int = 1024,
    with_entropy: bool = False,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax((W h_t + b) / temperature)[y_t]`` for each row ``t`` of ``hidden[N, H]``, in float32.

    ``weight`` is the output projection ``[V, H]``, ``targets`` the chosen tokens ``[N]``.
    ``temperature`` (> 0) is the sampling temperature: the log-probs are those of the
    distribution the tokens were sampled from, as vLLM reports them with
    ``logprobs_mode = "processed_logprobs"`` (and the entropy is that distribution's).
    At most ``chunk_tokens`` rows of logits exist at once, in the forward and in the backward
    pass. Returns ``(logprobs[N], entropy[N] or None)``; only the log-probs carry gradients.
    """
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    lp, ent = _ChunkedTokenLogprobs.apply(hidden, weight, bias, targets, int(chunk_tokens), bool(with_entropy), 1.0 / float(temperature))
    return lp, (ent if with_entropy else None)


class PolicyModel(torch.nn.Module):
    """A Hugging Face causal LM seen as a policy: ``forward`` returns chosen-token log-probs.

    ``lm`` must expose ``get_decoder()`` (the transformer body, returning the final normalised
    hidden states) and ``get_output_embeddings()`` (the output projection), as transformers'
    causal LMs do. Models that change the logits after the projection (soft-capping, scaling)
    are not supported: :meth:`check_against_full_logits` detects them.
    """

    def __init__(self, lm: torch.nn.Module, temperature: float = 1.0) -> None:
        super().__init__()
        self.lm = lm
        self.temperature = temperature
        """Sampling temperature the log-probs are computed at (see :func:`chunked_token_logprobs`)."""

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        select: torch.Tensor,
        chunk_tokens: int = 1024,
        with_entropy: bool = False,
        position_ids: torch.Tensor | None = None,
        hidden_index: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-prob of ``input_ids[b, t+1]`` given ``input_ids[b, :t+1]`` where ``select[b, t]``.

        ``input_ids``/``attention_mask`` are ``[B, T]`` (right padding), ``select`` is bool
        ``[B, T-1]``. Packed rows (several sequences end to end in one row): ``attention_mask``
        None and ``position_ids`` ``[1, N]`` restarting at 0 at each sequence, which transformers
        turns into attention within each sequence only. Returns flat tensors over the selected
        positions in row-major order.

        Rows laid out otherwise (a shared prefix, :mod:`agentrl.engine.training.shared_prefix`:
        ``attention_mask`` 4-D): ``hidden_index`` gives, for each wanted log-prob, the index of
        the hidden state that predicts it in the flattened ``[B * T]`` rows, and ``targets`` the
        token; ``select`` is then unused.
        """
        hidden = self.lm.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        head = self.lm.get_output_embeddings()
        if hidden_index is not None and targets is not None:
            h = hidden.reshape(-1, hidden.shape[-1])[hidden_index]
        else:
            h = hidden[:, :-1][select]
            targets = input_ids[:, 1:][select]
        return chunked_token_logprobs(
            h, head.weight, targets, bias=getattr(head, "bias", None), chunk_tokens=chunk_tokens, with_entropy=with_entropy,
            temperature=self.temperature,
        )

    @torch.no_grad()
    def check_against_full_logits(self, vocab_size: int, length: int = 8) -> float:
        """Largest |difference| between this path and ``log_softmax(lm(...).logits)`` on random
        tokens (call on the plain, not yet sharded, model)."""
        ids = torch.randint(0, vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
        device = next(self.lm.parameters()).device
        ids = ids.to(device)
        attn = torch.ones_like(ids)
        select = torch.ones(1, length - 1, dtype=torch.bool, device=device)
        lp, _ = self.forward(ids, attn, select)
        ref = torch.log_softmax(self.lm(input_ids=ids, attention_mask=attn).logits.float() / self.temperature, -1)[0, :-1]
        ref = ref.gather(-1, ids[0, 1:, None]).squeeze(-1)
        return float((lp - ref).abs().max())
