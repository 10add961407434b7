"""Saguaro sampling: draw each draft from q_C = normalise(q with its top-(F+1) probabilities scaled by C).

With C < 1 the residual max(p - q_C, 0) that a rejection samples from concentrates on the top tokens, i.e. on
the outcomes the speculation tree pre-drafted. The verifier gets q_C itself, so speculative sampling stays
exact for any C (the law each draft was drawn from is what is verified against).
"""

from __future__ import annotations

import torch


def saguaro_law(probs: torch.Tensor, top: torch.Tensor, scale: float) -> torch.Tensor:
    """q_C for rows of ``probs`` (R, W): the ``top`` (R, F+1) entries scaled by ``scale``, renormalised."""
    if scale == 1:
        return probs
    law = probs.scatter(1, top, probs.gather(1, top) * scale)
    return law / law.sum(dim=-1, keepdim=True)


def sample_drafts(logits: torch.Tensor, *, do_sample: bool, fan_out: int, scale: float = 1.0):
    """(R, W) processed draft-space logits -> (draft index (R,), law (R, W) or None under greedy, top (R, F+1)).

    ``top`` holds the F+1 largest UNSCALED entries (the outcome predictions read it), -1 where q is zero.
    """
    k = min(fan_out + 1, logits.shape[-1])
    if not do_sample:
        vals, top = logits.topk(k, dim=-1)
        return logits.argmax(dim=-1), None, top.masked_fill(vals == float("-inf"), -1)
    probs = logits.softmax(dim=-1)
    vals, top = probs.topk(k, dim=-1)
    law = saguaro_law(probs, top, scale)
    idx = torch.multinomial(law, num_samples=1)[:, 0]
    return idx, law, top.masked_fill(vals <= 0, -1)
