"""KL penalty estimators against a frozen reference policy (Schulman, 2020, "Approximating KL")."""

from __future__ import annotations

import torch


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of ``KL(pi_theta || pi_ref)`` from a token sampled by the policy.

    With ``d = log pi_ref(y_t) - log pi_theta(y_t)``::

        k1 = -d                    unbiased, high variance, can be negative
        k2 = d^2 / 2               biased, low variance
        k3 = exp(d) - d - 1        unbiased, low variance, never negative (GRPO's choice)

    Gradients flow through ``logprobs``; ``ref_logprobs`` is treated as a constant.
    Example ``logprobs = 0, ref = log 2``: ``k1 = -log 2, k2 = (log 2)^2 / 2, k3 = 1 - log 2``.
    """
    d = ref_logprobs.detach() - logprobs
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.exp(d) - d - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; expected k1, k2 or k3")
