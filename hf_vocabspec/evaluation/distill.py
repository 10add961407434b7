"""Distil a small same-tokenizer drafter from a target: its first layers, trained to match its next tokens.

No shipped model shares a tokenizer with the offline targets, and truncating a target without training
agrees with it only 3-8% of the time, so a drafter has to be trained. The student is the target's own
architecture with only its first ``num_layers`` layers, initialised from the target's first layers,
embeddings, final norm and (tied) head, then trained with KL(target || student) on next-token
distributions.

What it trains on: each conversation is rendered with the tokenizer's chat template and tokenized
turn by turn (prompt text and assistant text separately, as at inference); conversations are packed
into windows of ``seq_len`` tokens and the loss counts only positions whose NEXT token is assistant
text (the content plus its end-of-turn marker), so the student sees the prompts as context but is only
trained where a drafter drafts. The target runs under ``no_grad`` each step in ``target_dtype``
(bfloat16 by default: ~3x faster on CPUs with AVX-512 BF16); agreement is always scored against the
float32 target, computed once on held-out conversations that training never sees.

Checkpoints are plain ``save_pretrained`` directories (safetensors) plus ``trainer_state.json`` and
``optimizer.safetensors`` (AdamW moments by parameter name; no pickle), swapped in atomically, so a
killed run resumes from the last checkpoint with the same data order.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from jinja2 import TemplateError

from .._io import atomic_directory, recover_directory
from ..coverage import _ASSISTANT_ROLES, assistant_turn_format, normalized_messages

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
REPORT_FILE = "distill_report.json"
_FORMAT = 1
_MIN_EVAL_POSITIONS = 8
# No chat template: conversations render as each turn's content followed by eos (a base model's view).
_FALLBACK_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{{ eos_token }}{% endfor %}"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# settings that decide the data order, the student or the eval set: a resume must not change them
_RESUME_KEYS = ("num_layers", "seq_len", "batch_size", "seed", "eval_sequences", "max_conversation_tokens",
                "freeze_embeddings")


@dataclass
class DistillConfig:
    """What to distil and how long. ``target``/``dataset``/``tokenizer`` take names or loaded objects."""

    target: Any = "offline:smollm2-135m-instruct"
    num_layers: int = 4
    dataset: Any = "offline:sharegpt"
    tokenizer: Any = None  # default: the target's (required when ``target`` is a model object)
    output_dir: str | os.PathLike = "results/distilled/student"
    seq_len: int = 256
    batch_size: int = 8
    lr: float = 3e-4
    warmup_steps: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    max_steps: int | None = 1000
    time_budget_s: float | None = None  # wall clock for the whole call (loading and the final save included)
    seed: int = 0
    save_every: int = 50
    eval_sequences: int = 16
    max_conversation_tokens: int | None = 2048  # long conversations are cut so a few cannot fill an epoch
    target_dtype: str = "bfloat16"  # dtype of the target that produces training distributions
    autocast: bool = True  # bfloat16 autocast for the student's forward/backward (CPU AVX-512 BF16)
    freeze_embeddings: bool = True  # keep the (tied) embeddings/head equal to the target's: cheaper, no drift
    overwrite: bool = False  # start afresh even if output_dir holds a checkpoint
    extra: dict = field(default_factory=dict)  # recorded in the report as-is


# ----------------------------------------------------------------------------------------------- student


def _num_layers(config) -> int:
    return int(config.get_text_config().num_hidden_layers)


def _check_num_layers(num_layers: Any, total: int) -> None:
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1:
        raise ValueError(f"num_layers={num_layers!r}: a student needs at least 1 layer; "
                         f"pass --num-layers between 1 and {total - 1}.")
    if num_layers >= total:
        raise ValueError(f"num_layers={num_layers} >= the target's {total} layers: a student that deep is no "
                         f"cheaper than the target; pass --num-layers between 1 and {total - 1}.")


def build_student(target: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    """The target's architecture cut to its first ``num_layers`` layers, with the target's weights (fp32)."""
    _check_num_layers(num_layers, _num_layers(target.config))
    config = copy.deepcopy(target.config)
    text = config.get_text_config()
    text.num_hidden_layers = num_layers
    if isinstance(getattr(text, "layer_types", None), list):
        text.layer_types = text.layer_types[:num_layers]
    for attr in ("quantization_config",):
        if hasattr(config, attr):
            delattr(config, attr)
    student = type(target)(config).to(torch.float32)
    source = target.state_dict()
    own = student.state_dict()
    missing = [k for k in own if k not in source or source[k].shape != own[k].shape]
    if missing:
        raise ValueError(f"Cannot initialise the student from {type(target).__name__}: no matching target weights "
                         f"for {missing[:5]}; distil from a plain decoder-only causal LM.")
    with torch.no_grad():
        student.load_state_dict({k: source[k].to(torch.float32) for k in own}, strict=True)
    if getattr(config.get_text_config(), "tie_word_embeddings", False):
        student.tie_weights()
    student.generation_config = copy.deepcopy(target.generation_config)
    return student


# -------------------------------------------------------------------------------------------------- data


class _Tokenizer:
    """Turns one conversation into (ids, is_assistant) with prompt and assistant text tokenized separately."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tok = tokenizer
        self.template = None if getattr(tokenizer, "chat_template", None) else _FALLBACK_TEMPLATE
        self.suffix = assistant_turn_format(tokenizer).suffix

    def _render(self, messages: list[dict], gen: bool) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen,
                                            chat_template=self.template)

    def __call__(self, example: dict) -> tuple[list[int], list[bool]] | None:
        msgs = normalized_messages(example)
        while msgs and msgs[0]["role"] == "assistant":  # an answer with no prompt: nothing to condition on
            msgs = msgs[1:]
        last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=None)
        if last is None:
            return None
        msgs = msgs[: last + 1]  # later prompts have no answer to train on
        pieces: list[tuple[str, bool]] = []
        done = ""
        try:
            for i, m in enumerate(msgs):
                if m["role"] != "assistant":
                    continue
                prefix, full = self._render(msgs[:i], True), self._render(msgs[: i + 1], False)
                if not (prefix.startswith(done) and full.startswith(prefix)):
                    return None  # template is not prefix-consistent (rewrites earlier turns): skip
                seg = full[len(prefix):]
                cut = seg.rfind(self.suffix) + len(self.suffix) if self.suffix and self.suffix in seg else len(seg)
                pieces += [(prefix[len(done):], False), (seg[:cut], True), (seg[cut:], False)]
                done = full
        except (TemplateError, ValueError, TypeError, KeyError, IndexError):  # template rejects it: skip
            return None
        pieces = [(t, a) for t, a in pieces if t]
        enc = self.tok([t for t, _ in pieces], add_special_tokens=False)["input_ids"]
        ids, mask = [], []
        for piece_ids, (_, is_asst) in zip(enc, pieces):
            ids += piece_ids
            mask += [is_asst] * len(piece_ids)
        return (ids, mask) if any(mask) else None


def _check_dataset(dataset) -> None:
    n = len(dataset)
    if n == 0:
        raise ValueError("The dataset is empty: pass a chat dataset with assistant turns (e.g. offline:sharegpt).")
    for i in range(n):
        if any(m["role"] == "assistant" for m in normalized_messages(dataset[i])):
            return
    raise ValueError(f"The dataset has no assistant turns (role in {sorted(_ASSISTANT_ROLES)}) in any of its {n} "
                     "conversations: distillation trains on assistant text; pass a chat dataset with responses.")


class _Stream:
    """Packed ``seq_len`` windows over the training conversations; position = (epoch, pos, offset)."""

    def __init__(self, dataset, indices: list[int], tokenize: _Tokenizer, seq_len: int, seed: int,
                 max_tokens: int | None, state: dict | None = None):
        self.dataset, self.indices, self.tokenize = dataset, indices, tokenize
        self.seq_len, self.seed, self.max_tokens = seq_len, seed, max_tokens
        self.epoch, self.pos, self.offset = (state["epoch"], state["pos"], state["offset"]) if state else (0, 0, 0)
        self._order: tuple[int, list[int]] | None = None
        self._cached: tuple[int, tuple | None] | None = None

    def state(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "offset": self.offset}

    def _conversation(self) -> tuple[list[int], list[bool]] | None:
        if self._order is None or self._order[0] != self.epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            self._order = (self.epoch, torch.randperm(len(self.indices), generator=g).tolist())
        idx = self.indices[self._order[1][self.pos]]
        if self._cached is None or self._cached[0] != (self.epoch, self.pos):
            tokens = self.tokenize(self.dataset[idx])
            if tokens is not None and self.max_tokens:
                tokens = (tokens[0][: self.max_tokens], tokens[1][: self.max_tokens])
            self._cached = ((self.epoch, self.pos), tokens)
        return self._cached[1]

    def _advance(self) -> None:
        self.pos, self.offset = self.pos + 1, 0
        if self.pos >= len(self.indices):
            self.epoch, self.pos = self.epoch + 1, 0

    def window(self) -> tuple[list[int], list[bool]]:
        ids: list[int] = []
        mask: list[bool] = []
        empty_run = 0
        while len(ids) < self.seq_len:
            conv = self._conversation()
            if conv is None or self.offset >= len(conv[0]):
                empty_run = empty_run + 1 if conv is None else 0
                if empty_run > len(self.indices):
                    raise ValueError("No training conversation yields assistant tokens with this tokenizer's chat "
                                     "template: pass a chat dataset with assistant responses.")
                self._advance()
                continue
            take = min(self.seq_len - len(ids), len(conv[0]) - self.offset)
            ids += conv[0][self.offset: self.offset + take]
            mask += conv[1][self.offset: self.offset + take]
            self.offset += take
            if self.offset >= len(conv[0]):
                self._advance()
        return ids, mask

    def batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self.window() for _ in range(batch_size)]
        return torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows])


def _split(dataset, tokenize: _Tokenizer, n_eval: int, seq_len: int, seed: int):
    """Held-out eval windows (first ``seq_len`` tokens of the first conversations of a seeded shuffle)."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(dataset), generator=g).tolist()
    ids, mask, used = [], [], 0
    while len(ids) < n_eval and used < len(order):
        conv = tokenize(dataset[order[used]])
        used += 1
        if conv is None:
            continue
        w_ids, w_mask = conv[0][:seq_len], conv[1][:seq_len]
        if sum(w_mask[1:]) < _MIN_EVAL_POSITIONS:
            continue
        pad = seq_len - len(w_ids)
        ids.append(w_ids + [0] * pad)
        mask.append(w_mask + [False] * pad)
    train = order[used:]
    if not ids:
        raise ValueError("No held-out conversation has assistant text within seq_len tokens: pass a chat dataset "
                         "with assistant responses or a larger seq_len.")
    if not train:
        raise ValueError(f"All {len(dataset)} conversations went to the held-out eval set: pass a larger dataset "
                         "or fewer eval_sequences.")
    return torch.tensor(ids), torch.tensor(mask), train, used


# ------------------------------------------------------------------------------------------ train / eval


@torch.no_grad()
def _top1(model, ids: torch.Tensor, batch_size: int) -> torch.Tensor:
    out = [model(input_ids=ids[i: i + batch_size]).logits[:, :-1].argmax(-1) for i in range(0, len(ids), batch_size)]
    return torch.cat(out)


@torch.no_grad()
def top1_agreement(student, ids: torch.Tensor, mask: torch.Tensor, reference: torch.Tensor, batch_size: int = 8) -> float:
    """Share of assistant next-token positions where the student's argmax equals the target's."""
    was_training = student.training
    student.eval()
    try:
        sel = mask[:, 1:]
        hit = (_top1(student, ids, batch_size) == reference) & sel
        return float(hit.sum()) / max(1, int(sel.sum()))
    finally:
        student.train(was_training)


def _kl_loss(student, target, ids: torch.Tensor, mask: torch.Tensor, autocast: bool) -> torch.Tensor:
    """KL(target || student) averaged over positions whose next token is assistant text."""
    sel = mask[:, 1:]
    with torch.no_grad():
        t_logp = target(input_ids=ids).logits[:, :-1][sel].float().log_softmax(-1)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        s_logits = student(input_ids=ids).logits[:, :-1][sel]
    s_logp = s_logits.float().log_softmax(-1)
    return F.kl_div(s_logp, t_logp, log_target=True, reduction="batchmean")


def _lr_at(step: int, cfg: DistillConfig) -> float:
    """Linear warmup, then constant: a schedule that does not depend on how long a resumed run goes on."""
    return cfg.lr * min(1.0, (step + 1) / max(1, cfg.warmup_steps))


def _trainable(student, cfg: DistillConfig) -> list[tuple[str, torch.nn.Parameter]]:
    emb = student.get_input_embeddings().weight
    head = student.get_output_embeddings()
    frozen = {id(emb), id(head.weight)} if cfg.freeze_embeddings and head is not None else set()
    named = []
    for name, p in student.named_parameters():
        p.requires_grad_(id(p) not in frozen)
        if p.requires_grad:
            named.append((name, p))
    return named


# ----------------------------------------------------------------------------------------- checkpointing


def _save_optimizer(opt: torch.optim.Optimizer, names: list[str], path: Path) -> dict:
    from safetensors.torch import save_file

    sd = opt.state_dict()
    tensors = {}
    for i, name in enumerate(names):
        for key, value in sd["state"].get(i, {}).items():
            t = value if torch.is_tensor(value) else torch.tensor(value)
            tensors[f"{name}::{key}"] = t.detach().contiguous().clone()
    save_file(tensors, str(path))
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"}
              for g in sd["param_groups"]]
    return {"file": OPTIMIZER_FILE, "param_names": names, "param_groups": groups}


def _load_optimizer(opt: torch.optim.Optimizer, names: list[str], index: dict, path: Path) -> None:
    from safetensors.torch import load_file

    if index["param_names"] != names:
        raise ValueError(f"{path.parent} was trained with different trainable parameters (freeze_embeddings "
                         "changed?): resume with the same settings or pass overwrite=True / --overwrite.")
    tensors = load_file(str(path))
    state: dict[int, dict] = {}
    for key, t in tensors.items():
        name, _, slot = key.rpartition("::")
        state.setdefault(names.index(name), {})[slot] = t
    groups = []
    for g in index["param_groups"]:
        g = dict(g, params=list(range(len(names))))
        if isinstance(g.get("betas"), list):
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    opt.load_state_dict({"state": state, "param_groups": groups})


def _describe(obj: Any) -> str:
    if isinstance(obj, (str, os.PathLike)):
        return str(obj)
    name = getattr(getattr(obj, "config", None), "_name_or_path", "") or getattr(obj, "name_or_path", "")
    return f"<{type(obj).__name__}{' ' + name if name else ''}>"


def _cfg_record(cfg: DistillConfig) -> dict:
    rec = {k: v for k, v in asdict(cfg).items() if k not in ("target", "dataset", "tokenizer", "output_dir")}
    rec.update(target=_describe(cfg.target), dataset=_describe(cfg.dataset), tokenizer=_describe(cfg.tokenizer))
    return rec


# ---------------------------------------------------------------------------------------------- distill


def _load(cfg: DistillConfig):
    from .offline import load_chat_dataset, load_model, load_tokenizer

    target = load_model(cfg.target, dtype=torch.float32) if isinstance(cfg.target, (str, os.PathLike)) else cfg.target
    if cfg.tokenizer is None:
        if not isinstance(cfg.target, (str, os.PathLike)):
            raise ValueError("target is a model object: pass tokenizer= (the target's tokenizer) as well.")
        tokenizer = load_tokenizer(str(cfg.target))
    else:
        tokenizer = load_tokenizer(cfg.tokenizer) if isinstance(cfg.tokenizer, (str, os.PathLike)) else cfg.tokenizer
    if isinstance(cfg.dataset, (str, os.PathLike)):
        dataset = load_chat_dataset(str(cfg.dataset))
    elif isinstance(cfg.dataset, list):
        import datasets

        dataset = datasets.Dataset.from_list(cfg.dataset)
    else:
        dataset = cfg.dataset
    return target.eval(), tokenizer, dataset


def _validate(cfg: DistillConfig) -> None:
    for name in ("seq_len", "batch_size", "save_every", "eval_sequences"):
        v = getattr(cfg, name)
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r}: pass a positive integer.")
    if cfg.seq_len < 2:
        raise ValueError("seq_len must be at least 2 (a position and its next token).")
    if cfg.max_steps is None and cfg.time_budget_s is None:
        raise ValueError("Neither max_steps nor time_budget_s is set: pass --max-steps and/or --time-budget.")
    if cfg.max_steps is not None and cfg.max_steps < 0:
        raise ValueError(f"max_steps={cfg.max_steps}: pass 0 or more.")
    if cfg.target_dtype not in _DTYPES:
        raise ValueError(f"target_dtype={cfg.target_dtype!r}: pass one of {sorted(_DTYPES)}.")
    if cfg.lr <= 0:
        raise ValueError(f"lr={cfg.lr}: pass a positive learning rate.")


def distill(cfg: DistillConfig, progress: bool = True) -> dict:
    """Train (or resume) a ``num_layers`` student of ``cfg.target`` into ``cfg.output_dir``; returns a summary.

    Stops at ``max_steps``, when ``time_budget_s`` would be exceeded (leaving time for the final eval and
    save), or on SIGINT/SIGTERM, and always saves before returning.
    """
    t0 = time.perf_counter()
    _validate(cfg)
    out = Path(cfg.output_dir)
    recover_directory(out, lambda d: (d / STATE_FILE).is_file())
    state_path = out / STATE_FILE
    if out.exists() and not cfg.overwrite and not state_path.is_file() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not a distillation checkpoint (no {STATE_FILE}): choose a new "
                              "--output directory or pass --overwrite.")
    resume = state_path.is_file() and not cfg.overwrite
    saved = json.loads(state_path.read_text()) if resume else None

    target, tokenizer, dataset = _load(cfg)
    # errors that name the fix come before any slow work
    _check_num_layers(cfg.num_layers, _num_layers(target.config))
    _check_dataset(dataset)
    if saved is not None:
        rec = _cfg_record(cfg)
        diff = {k: (saved["config"].get(k), rec[k]) for k in _RESUME_KEYS + ("target", "dataset")
                if saved["config"].get(k) != rec[k] and not str(rec[k]).startswith("<")}
        if diff:
            raise ValueError(f"{out} holds a run with different settings {diff} (saved, now): resume with the same "
                             "settings, or choose a new --output / pass --overwrite.")

    tokenize = _Tokenizer(tokenizer)
    eval_ids, eval_mask, train_idx, held_out = _split(dataset, tokenize, cfg.eval_sequences, cfg.seq_len, cfg.seed)
    reference = _top1(target, eval_ids, cfg.batch_size)  # the fp32 (as given) target's choices
    reference_dtype = str(target.dtype).removeprefix("torch.")
    train_target = target
    if target.dtype != _DTYPES[cfg.target_dtype]:
        train_target = (copy.deepcopy(target) if target is cfg.target else target).to(_DTYPES[cfg.target_dtype])
    train_target.eval().requires_grad_(False)

    if saved is not None:
        student = type(target).from_pretrained(out, dtype=torch.float32)
        if _num_layers(student.config) != cfg.num_layers:
            raise ValueError(f"{out} holds a {_num_layers(student.config)}-layer student, not {cfg.num_layers}: "
                             "pass the same --num-layers or a new --output.")
    else:
        student = build_student(target, cfg.num_layers)
    student.config.use_cache = False
    student.train()
    named = _trainable(student, cfg)
    names = [n for n, _ in named]
    opt = torch.optim.AdamW([p for _, p in named], lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    if saved is not None:
        _load_optimizer(opt, names, saved["optimizer"], out / OPTIMIZER_FILE)

    step = saved["step"] if saved else 0
    history = saved["history"] if saved else {"loss": [], "agreement": []}
    tokens_seen = saved["tokens_seen"] if saved else 0
    assistant_positions = saved["assistant_positions_seen"] if saved else 0
    seconds_before = saved["seconds_total"] if saved else 0.0
    t_eval = time.perf_counter()
    agreement = top1_agreement(student, eval_ids, eval_mask, reference, cfg.batch_size)
    eval_seconds = time.perf_counter() - t_eval
    initial = saved["initial_agreement"] if saved else agreement
    if not saved:
        history["agreement"].append([0, agreement])
    stream = _Stream(dataset, train_idx, tokenize, cfg.seq_len, cfg.seed, cfg.max_conversation_tokens,
                     saved["data"] if saved else None)
    torch.manual_seed(cfg.seed)  # nothing here draws random numbers today; a fixed seed keeps it so

    n_student = sum(p.numel() for p in student.parameters())
    meta = {"target": _describe(cfg.target), "num_layers": cfg.num_layers,
            "target_layers": _num_layers(target.config), "student_parameters": n_student,
            "eval_sequences": int(len(eval_ids)), "eval_positions": int(eval_mask[:, 1:].sum()),
            "held_out_conversations": held_out, "train_conversations": len(train_idx),
            "trained_on": "assistant next-token positions of chat-templated conversations (prompts are context)",
            "target_dtype_for_training": cfg.target_dtype, "agreement_reference": f"{reference_dtype} target, argmax",
            "student_autocast_bf16": cfg.autocast}

    def save(agr: float) -> float:
        ts = time.perf_counter()
        total_s = seconds_before + (ts - t0)
        report = dict(meta, step=step, initial_agreement=initial, final_agreement=agr,
                      loss_first=history["loss"][0][1] if history["loss"] else None,
                      loss_last=history["loss"][-1][1] if history["loss"] else None,
                      tokens_seen=tokens_seen, assistant_positions_seen=assistant_positions,
                      seconds_total=round(total_s, 1), agreement_history=history["agreement"],
                      config=_cfg_record(cfg))

        def write(tmp: Path) -> None:
            student.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            opt_index = _save_optimizer(opt, names, tmp / OPTIMIZER_FILE)
            state = {"format": _FORMAT, "step": step, "data": stream.state(), "seed": cfg.seed,
                     "initial_agreement": initial, "history": history, "tokens_seen": tokens_seen,
                     "assistant_positions_seen": assistant_positions, "seconds_total": total_s,
                     "held_out_conversations": held_out, "config": _cfg_record(cfg), "optimizer": opt_index}
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
            (tmp / REPORT_FILE).write_text(json.dumps(report, indent=2))

        atomic_directory(out, write)
        return time.perf_counter() - ts

    stop_flag = threading.Event()
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        def on_signal(signum, frame):  # first signal: finish the step and save; a second one kills as usual
            stop_flag.set()
            signal.signal(signum, handlers[signum])
        for sig in (signal.SIGINT, signal.SIGTERM):
            handlers[sig] = signal.getsignal(sig)
            signal.signal(sig, on_signal)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.max_steps, initial=step, desc=f"distill {cfg.num_layers}L", unit="step")
    steps_done, step_times, save_seconds = 0, [], 5.0 + eval_seconds
    reason = "max_steps"
    last_saved = step if saved else -1
    try:
        while cfg.max_steps is None or step < cfg.max_steps:
            if stop_flag.is_set():
                reason = "interrupted"
                break
            if cfg.time_budget_s is not None:
                est = max(step_times[-3:]) if step_times else 0.0
                if time.perf_counter() - t0 + est + save_seconds + eval_seconds > cfg.time_budget_s:
                    reason = "time_budget"
                    break
            ts = time.perf_counter()
            ids, mask = stream.batch(cfg.batch_size)
            for g in opt.param_groups:
                g["lr"] = _lr_at(step, cfg)
            loss = _kl_loss(student, train_target, ids, mask, cfg.autocast)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_([p for _, p in named], cfg.grad_clip)
            opt.step()
            loss_value = loss.item()
            step += 1
            steps_done += 1
            tokens_seen += ids.numel()
            assistant_positions += int(mask[:, 1:].sum())
            history["loss"].append([step, round(loss_value, 5)])
            step_times.append(time.perf_counter() - ts)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss_value:.3f}", s_step=f"{step_times[-1]:.1f}")
            if step % cfg.save_every == 0 and (cfg.max_steps is None or step < cfg.max_steps):
                agreement = top1_agreement(student, eval_ids, eval_mask, reference, cfg.batch_size)
                history["agreement"].append([step, agreement])
                save_seconds = save(agreement)
                last_saved = step
                if bar is not None:
                    bar.set_postfix(loss=f"{loss_value:.3f}", agree=f"{agreement:.1%}")
        if steps_done or last_saved != step:
            agreement = top1_agreement(student, eval_ids, eval_mask, reference, cfg.batch_size)
            if not history["agreement"] or history["agreement"][-1][0] != step:
                history["agreement"].append([step, agreement])
        save(agreement)
    finally:
        if bar is not None:
            bar.close()
        for sig, h in handlers.items():
            signal.signal(sig, h)

    seconds = time.perf_counter() - t0
    return dict(meta, output_dir=str(out), step=step, steps_done=steps_done, stopped=reason,
                initial_agreement=initial, final_agreement=agreement,
                loss_first=history["loss"][0][1] if history["loss"] else None,
                loss_last=history["loss"][-1][1] if history["loss"] else None,
                tokens_seen=tokens_seen, assistant_positions_seen=assistant_positions, seconds=round(seconds, 1),
                seconds_per_step=round(sum(step_times) / len(step_times), 3) if step_times else None)


__all__ = ["DistillConfig", "build_student", "distill", "top1_agreement"]
