"""The one door between the device and the host for the generation loops: every device-to-host read goes through
:func:`read` (counted), every small host list the loop sends to the device through :func:`upload`.

On a GPU a read (``.tolist()``, ``.item()``, ``bool(t)``, ``int(t)``, ``nonzero()``) waits for every queued kernel:
the device idles while the host catches up. The engine reads once per round (the round's outcome: accepted
drafts, new tokens, the drafts, what each row proposed, in one small tensor) and keeps the rest of its bookkeeping
(computing rows, padding, lengths) as host lists. ``SpeculationStats.host_syncs`` counts the reads of the loop
(rounds and plain steps), ``setup_syncs`` those made once per call (prompt layout, EOS ids, final counters).
On CPU a read costs no wait, but the count is what a GPU would pay.
"""

from __future__ import annotations

import torch


def read(tensor: torch.Tensor, stats=None, *, setup: bool = False):
    """``tensor.tolist()`` (a Python scalar for a 0-d tensor), counted in ``stats`` as one host sync."""
    if stats is not None:
        if setup:
            stats.setup_syncs += 1
        else:
            stats.host_syncs += 1
    return tensor.tolist()


def upload(values, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A small host list as a tensor on ``device``; on CUDA through pinned memory without waiting (a plain copy
    from pageable memory synchronizes the stream)."""
    if torch.device(device).type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype).pin_memory().to(device, non_blocking=True)
