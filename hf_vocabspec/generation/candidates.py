"""The batch-1 candidate generator: drafts in the trimmed vocabulary inside transformers' own verification
loop (``_assisted_decoding``), entered through :mod:`hf_vocabspec.generation.hooks`.

It subclasses ``AssistedCandidateGenerator`` for its bookkeeping (assistant generation config,
num_assistant_tokens schedule, main-model max length) but runs its own draft loop: body forward, trimmed head,
logits processors translated to draft space, sample/argmax, map to target ids. No step touches the full target
vocabulary; the full-vocabulary q is materialised once per round, and only under sampling (greedy verification
does not read it). Lossless by construction: under sampling the returned q is exactly the distribution each draft
token was drawn from (float32, -inf on pruned ids), and HF's verifier accepts/resamples against the target's p.
The target's processors are applied ONCE to the draft (no double temperature as in HF's assistant.generate path).
RDK (rdk.py): with a kernel attached, ``drafter.use_rdk`` and do_sample=True, each draw i ~ q' is moved to
j ~ M[i] (possibly a pruned token) and the returned q is the exact q_RDK = M^T q', built from the same float32
kernel both steps use. Under greedy the kernel is not used (see docs/rdk.md).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache
from transformers.generation.candidate_generator import AssistedCandidateGenerator

from ..drafter import TrimmedDrafter, VocabularyMapError, cache_kwarg
from ..rdk import drafter_kernel
from .stats import SpeculationStats
from .vocabulary import DraftVocabulary, draft_space_processors


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
        if target_vocab_size is not None and target_vocab_size != drafter.config.vocab_size:
            raise VocabularyMapError(
                f"The drafter was trimmed for a vocabulary of {drafter.config.vocab_size} tokens but the target has "
                f"{target_vocab_size}: drafter and target must share a tokenizer. Trim a drafter that uses the "
                "target's tokenizer (hf_vocabspec.trim_drafter)."
            )
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
        self.vocab = DraftVocabulary(drafter, bool(getattr(drafter, "use_context_tokens", False)),
                                     int(drafter.config.max_context_tokens))
        self.draft_processors = draft_space_processors(self.logits_processor, self.vocab)
        eos = generation_config._eos_token_tensor if hasattr(generation_config, "_eos_token_tensor") else None
        if eos is None and generation_config.eos_token_id is not None:
            eos = torch.tensor(generation_config.eos_token_id).flatten()
        self.eos = eos.to(drafter.device) if eos is not None else None
        self.cache = None
        self.fed = torch.empty(0, dtype=torch.long, device=drafter.device)
        self.rdk = None
        if self.do_sample and getattr(drafter, "use_rdk", False):
            kernel = drafter_kernel(drafter)
            self.rdk = kernel.to(drafter.device) if kernel is not None else None
        self.stats = SpeculationStats()
        drafter.last_speculation_stats = self.stats

    def _sync_cache(self, input_ids: torch.LongTensor) -> torch.LongTensor:
        """Roll the drafter cache back to the longest prefix it shares with input_ids; return ids to feed."""
        if self.cache is None:
            self.cache = DynamicCache(config=self.drafter.model.config)
            if hasattr(self.cache, "activate_past_recording"):
                self.cache.activate_past_recording()
        seq = input_ids[0]
        n = min(self.fed.numel(), seq.numel() - 1)
        same = self.fed[:n] == seq[:n]
        keep = n if bool(same.all()) else int((~same).nonzero()[0])
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
        vocab = self.vocab
        vocab.update(input_ids)  # fixed for the whole round: every draft of it uses the same draft space
        seq = input_ids
        drafted_logits = []
        drafted_ids = []
        for _ in range(max_new):
            start = self.fed.numel()
            positions = torch.arange(start, start + to_feed.shape[1], device=drafter.device)[None, :]
            out = drafter.model(input_ids=to_feed, position_ids=positions, use_cache=True,
                                 **{cache_kwarg(drafter.model): self.cache})
            self.fed = torch.cat([self.fed, to_feed[0]])
            logits = vocab.logits(out.last_hidden_state[:, -1]).float()
            for proc in self.draft_processors:
                logits = proc(seq, logits)
            if self.do_sample:
                probs = logits.softmax(dim=-1)
                idx = torch.multinomial(probs, num_samples=1)
                drafted_logits.append(probs if self.rdk is not None else logits)
            else:
                idx = logits.argmax(dim=-1, keepdim=True)
            token = vocab.ids[idx]  # (1, 1) target id
            if self.rdk is not None and int(idx) < vocab.k:
                token = self.rdk.sample(idx)  # j ~ M[i]: the kept token or one of its pruned neighbours
                self.stats.pruned_proposed += int((token != drafter.d2t[idx]).item())
            if vocab.num_context:  # (the int() is a device sync: skipped when there is nothing to count)
                self.stats.context_proposed += int(idx) >= vocab.k
            drafted_ids.append(token)
            seq = torch.cat([seq, token], dim=1)
            to_feed = token
            self.stats.draft_steps += 1
            if self.eos is not None and bool(torch.isin(token, self.eos).any()):
                break
            # transformers' ConfidenceCriteria: stop after a draft the drafter gave less than the threshold, greedy
            # or sampled (the stop depends on the drafter's own draws only, so verification stays exact)
            if self.assistant_confidence_threshold:
                chosen = probs.gather(-1, idx) if self.do_sample else logits.softmax(dim=-1).gather(-1, idx)
                if float(chosen) < self.assistant_confidence_threshold:
                    break
        candidate_logits = None
        if self.do_sample:
            stacked = torch.stack(drafted_logits, dim=1)  # (1, L, K + C)
            if self.rdk is not None:  # exact q_RDK = M^T q' (+ context tokens' own mass); HF softmaxes it back
                q = self.rdk.redistribute(stacked[..., : vocab.k])
                if vocab.num_context:
                    q.index_add_(-1, vocab.ids[vocab.k :], stacked[..., vocab.k :])
                candidate_logits = q.log()
            else:
                candidate_logits = vocab.scatter(stacked)  # once per round: (1, L, V)
        return seq, candidate_logits

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int):
        proposed = scores.shape[1] - 1
        self.stats.rounds += 1
        self.stats.row_rounds += 1
        self.stats.batch_size = 1
        self.stats.proposed += proposed
        self.stats.accepted += int(num_matches)
        self.stats.per_round_accepted.append(int(num_matches))
        self.stats.per_round_proposed.append(proposed)
        schedule = self.assistant_generation_config.num_assistant_tokens_schedule
        if schedule in {"heuristic", "heuristic_transient"}:
            if num_matches == proposed:
                self.num_assistant_tokens += 2
            else:
                self.num_assistant_tokens = max(1, self.num_assistant_tokens - 1)
