"""The one door between the device and the host for the generation loops: every device-to-host read goes through
:func:`read` (counted), every small host list the loop sends to the device through :func:`upload`.

On a GPU a read (``.tolist()``, ``.item()``, ``bool(t)``, ``int(t)``, ``nonzero()``) waits for every queued kernel:
the device idles while the host catches up. The engine reads once per round (the round's outcome: accepted
drafts, new tokens, the drafts, what each row proposed, in one small tensor) and keeps the rest of its bookkeeping
(computing rows, padding, lengths) as host lists. ``SpeculationStats.host_syncs`` counts the reads of the loop
(rounds and plain steps), ``setup_syncs`` those made once per call (prompt layout, EOS ids, final counters).
On CPU a read costs no wait, but the count is what a GPU would pay.

A flag the loop may act on one step late (the confidence stop: drafting one more position is exact, only its cost
changes) is read with :class:`LaggedRead` on a GPU: its copy is queued now, its value taken after the next step is
queued, so the device never idles on it (``SpeculationStats.lagged_reads``, not ``host_syncs``).
"""

from __future__ import annotations

import torch


def read(tensor: torch.Tensor | tuple[torch.Tensor, ...], stats=None, *, setup: bool = False):
    """``tensor.tolist()`` (a Python scalar for a 0-d tensor), counted in ``stats`` as one host sync. A tuple of
    tensors: a tuple of their lists, one sync (the first read waits for the queue; the others find their values
    computed), without an op to pack them into one tensor."""
    if stats is not None:
        if setup:
            stats.setup_syncs += 1
        else:
            stats.host_syncs += 1
    if isinstance(tensor, tuple):
        return tuple(t.tolist() for t in tensor)
    return tensor.tolist()


def upload(values, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A small host list as a tensor on ``device``; on CUDA through pinned memory without waiting (a plain copy
    from pageable memory synchronizes the stream)."""
    if torch.device(device).type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype).pin_memory().to(device, non_blocking=True)


def lags_reads(device: torch.device) -> bool:
    """Whether the loop reads its per-draft stop flag one draft late (:class:`LaggedRead`): on CUDA, where an
    immediate read stalls the device every drafted position; on CPU a read costs no wait and the late stop would cost
    a drafter step, so the flag is read at once."""
    return torch.device(device).type == "cuda"


class LaggedRead:
    """A 0-d device value read later: on CUDA its copy goes to pinned memory behind the work queued so far
    (``non_blocking``, an event recorded), and :meth:`value` waits only for that copy; on CPU the value as it is
    now. Counted in ``stats.lagged_reads`` when taken."""

    def __init__(self, tensor: torch.Tensor, stats=None):
        self.stats, self.event = stats, None
        if tensor.device.type == "cuda":
            self.host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self.host.copy_(tensor, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = tensor.clone()

    def value(self):
        """The value (a Python scalar), waiting for its copy only (the work queued after it goes on)."""
        if self.event is not None:
            self.event.synchronize()
        if self.stats is not None:
            self.stats.lagged_reads += 1
        return self.host.item()
