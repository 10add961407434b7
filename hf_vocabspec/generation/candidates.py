"""The candidate generator inside transformers' own verification loop (``_assisted_decoding``).

Plain calls with a trimmed drafter run in our engine (:mod:`.engine`) at every batch size; this subclass of
transformers' ``AssistedCandidateGenerator`` is what SSD sessions (:mod:`hf_vocabspec.ssd`) draft through, the way
transformers calls a candidate generator. It keeps HF's bookkeeping (assistant generation config, schedule,
main-model max length) and drafts through THE draft step (:class:`~.draft_step.DraftStep`): no step touches the
full target vocabulary, and under sampling the returned q is exactly the law each draft was drawn from (float32,
-inf on pruned ids; with RDK the exact q_RDK = M^T q'), built once per round.
"""

from __future__ import annotations

import torch
from transformers.generation.candidate_generator import AssistedCandidateGenerator

from ..compatibility import check_compatibility
from ..modeling import TrimmedDrafter
from .draft_step import DraftStep
from .host import read
from .stats import SpeculationStats


class TrimmedCandidateGenerator(AssistedCandidateGenerator):
    """Drafts in the trimmed vocabulary; returns target ids and (under sampling) the exact full-vocab q."""

    def __init__(
        self,
        input_ids: torch.LongTensor,
        assistant_model: TrimmedDrafter,
        generation_config,
        model_kwargs: dict,
        inputs_tensor: torch.Tensor | None = None,
        logits_processor=None,
        target_vocab_size: int | None = None,
    ):
        super().__init__(input_ids, assistant_model, generation_config, model_kwargs, inputs_tensor, logits_processor)
        drafter = assistant_model
        drafter.validate_vocab_map()
        check_compatibility(drafter, target=target_vocab_size or drafter.config.vocab_size)
        if generation_config.assistant_ensemble_weight is not None:
            raise ValueError(
                "assistant_ensemble_weight makes verification lossy; hf_vocabspec only does lossless speculative "
                "decoding. Remove `assistant_ensemble_weight`."
            )
        # num_assistant_tokens & co: a value passed to target.generate() (anything but the library default)
        # wins over the drafter's generation_config; HF ignores it otherwise (transformers #40739).
        defaults = generation_config._get_default_generation_params()
        for name in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold"):
            value = getattr(generation_config, name, None)
            if value is not None and value != defaults.get(name):
                setattr(self.assistant_generation_config, name, value)
        self.num_assistant_tokens = self.assistant_generation_config.num_assistant_tokens
        self.assistant_confidence_threshold = self.assistant_generation_config.assistant_confidence_threshold
        self.drafter = drafter
        self.do_sample = bool(generation_config.do_sample)
        self._stats = SpeculationStats()
        self.target_vocab_size = target_vocab_size or drafter.config.vocab_size
        self.step = DraftStep(drafter, self.logits_processor, do_sample=self.do_sample,
                              confidence_threshold=self.assistant_confidence_threshold or 0.0, stats=self._stats,
                              vocab_size=self.target_vocab_size)
        self.vocab = self.step.vocab
        self.rdk = self.step.rdk
        self.draft_processors = self.step.processors
        eos = generation_config._eos_token_tensor if hasattr(generation_config, "_eos_token_tensor") else None
        if eos is None and generation_config.eos_token_id is not None:
            eos = torch.tensor(generation_config.eos_token_id).flatten()
        self.eos = eos.to(drafter.device) if eos is not None else None
        self.cache = None
        self.fed = torch.empty(0, dtype=torch.long, device=drafter.device)
        drafter.last_speculation_stats = self.stats

    @property
    def stats(self) -> SpeculationStats:
        return self._stats

    @stats.setter
    def stats(self, value: SpeculationStats) -> None:  # SSD swaps in its own counters: the draft step counts there
        self._stats = value
        self.step.stats = value

    def _sync_cache(self, input_ids: torch.LongTensor) -> torch.LongTensor:
        """Roll the drafter cache back to the longest prefix it shares with input_ids; return ids to feed."""
        if self.cache is None:
            self.cache = self.step.new_cache()
        seq = input_ids[0]
        n = min(self.fed.numel(), seq.numel() - 1)
        differs = (self.fed[:n] != seq[:n]).long()
        # one read: the first column that differs (n where none does)
        keep = read(torch.where(differs.any(), differs.argmax(), n), self.stats) if n > 0 else 0
        remove = self.fed.numel() - keep
        if self.fed.numel():  # crop() on a never-filled sliding layer fails
            self.cache.crop(-remove)
        self.fed = self.fed[:keep]
        return input_ids[:, keep:]

    @torch.no_grad()
    def get_candidates(self, input_ids: torch.LongTensor, *args, **kwargs):
        drafter = self.drafter
        input_ids = input_ids.to(drafter.device)
        cur_len = input_ids.shape[1]
        max_new = min(int(self.num_assistant_tokens), self.main_model_max_length - cur_len - 1)
        if max_new <= 0:
            return input_ids, None
        to_feed = self._sync_cache(input_ids)
        self.vocab.update(input_ids)  # fixed for the whole round: every draft of it uses the same draft space
        seq = input_ids
        laws = []
        for _ in range(max_new):
            start = self.fed.numel()
            positions = torch.arange(start, start + to_feed.shape[1], device=drafter.device)[None, :]
            drafted = self.step(to_feed, self.cache, [seq[0]], [0], position_ids=positions)
            self.fed = torch.cat([self.fed, to_feed[0]])
            if drafted.probs is not None:
                laws.append(drafted.probs)
            seq = torch.cat([seq, drafted.token], dim=1)
            to_feed = drafted.token
            unsure = drafted.unsure
            stop = unsure.any() if unsure is not None else None  # transformers' ConfidenceCriteria:
            if self.eos is not None:  # stop after an unsure draft, and (as transformers' loop) at an EOS
                eos = torch.isin(drafted.token, self.eos).any()
                stop = eos if stop is None else stop | eos
            if stop is not None and read(stop, self.stats):  # one read per drafted token
                break
        if not laws:
            return seq, None
        q = self.step.q_target(torch.stack(laws, dim=1), self.target_vocab_size)  # once per round: (1, L, V)
        return seq, q.log()  # HF softmaxes it back: exactly q

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int):
        proposed = scores.shape[1] - 1
        self.stats.rounds += 1
        self.stats.row_rounds += 1
        self.stats.batch_size = 1
        self.stats.proposed += proposed
        if isinstance(num_matches, torch.Tensor):
            num_matches = read(num_matches, self.stats)
        self.stats.accepted += int(num_matches)
        self.stats.per_round_accepted.append(int(num_matches))
        self.stats.per_round_proposed.append(proposed)
        schedule = self.assistant_generation_config.num_assistant_tokens_schedule
        if schedule in {"heuristic", "heuristic_transient"}:
            if num_matches == proposed:
                self.num_assistant_tokens += 2
            else:
                self.num_assistant_tokens = max(1, self.num_assistant_tokens - 1)
