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

The loop is transformers' ``Trainer`` (so ``accelerate launch`` runs it data-parallel on N processes or
GPUs unchanged): :class:`DistillTrainer` adds the KL loss with the frozen target held OUTSIDE the trained
model (never in the optimizer, never wrapped by DDP), the held-out agreement as its ``evaluate``, and
checkpoints without pickle (Trainer's ``torch.save`` of optimizer, scheduler, RNG and arguments replaced by
safetensors + JSON). :class:`_Budget` stops cleanly on the wall-clock budget or SIGINT/SIGTERM, agreed by
all ranks. Checkpoints live in ``<output>.checkpoints/checkpoint-N``; the finished student (plus
``distill_report.json``) is swapped into ``<output>`` atomically.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import random
import shutil
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from jinja2 import TemplateError
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from .._io import atomic_directory, atomic_write, recover_directory
from ..coverage import _ASSISTANT_ROLES, assistant_turn_format, normalized_messages

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

OPTIMIZER_FILE = "optimizer.safetensors"
SCHEDULER_FILE = "scheduler.json"
CONFIG_FILE = "distill_config.json"
REPORT_FILE = "distill_report.json"
TRAINER_STATE_FILE = "trainer_state.json"  # Trainer writes it last: a checkpoint with it is complete
_FORMAT = 2
_MIN_EVAL_POSITIONS = 8
_NO_STEP_LIMIT = 10**9  # Trainer needs max_steps with a streamed dataset; the time budget stops it first
# No chat template: conversations render as each turn's content followed by eos (a base model's view).
_FALLBACK_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{{ eos_token }}{% endfor %}"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# settings that decide the data order, the student or the eval set: a resume must not change them
_RESUME_KEYS = ("num_layers", "seq_len", "batch_size", "seed", "eval_sequences", "max_conversation_tokens",
                "freeze_embeddings", "world_size")


@dataclass
class DistillConfig:
    """What to distil and how long. ``target``/``dataset``/``tokenizer`` take names or loaded objects.

    ``batch_size`` is per process: under ``accelerate launch`` on N processes a step sees N x batch_size windows.
    """

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


@dataclass
class DistillResult:
    """What a ``distill`` call did; ``world_size`` processes took part (``accelerate launch``)."""

    output_dir: str
    checkpoint_dir: str
    step: int
    steps_done: int
    stopped: str  # "max_steps", "time_budget" or "interrupted"
    initial_agreement: float
    final_agreement: float
    loss_first: float | None
    loss_last: float | None
    tokens_seen: int
    assistant_positions_seen: int
    seconds: float
    seconds_per_step: float | None
    world_size: int
    global_batch: int
    meta: dict

    def to_dict(self) -> dict:
        return asdict(self)


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


class _Windows(torch.utils.data.IterableDataset):
    """Packed ``seq_len`` windows over the training conversations, endless, in a seeded order per epoch.

    The sequence of windows depends only on the seed, so Trainer's resume (which replays and skips the
    batches already trained on) continues with exactly the windows an uninterrupted run would see.
    """

    def __init__(self, dataset, indices: list[int], tokenize: _Tokenizer, seq_len: int, seed: int,
                 max_tokens: int | None):
        self.dataset, self.indices, self.tokenize = dataset, indices, tokenize
        self.seq_len, self.seed, self.max_tokens = seq_len, seed, max_tokens

    def _conversations(self):
        epoch, empty_run = 0, 0
        while True:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            for j in torch.randperm(len(self.indices), generator=g).tolist():
                tokens = self.tokenize(self.dataset[self.indices[j]])
                if tokens is None:
                    empty_run += 1
                    if empty_run > len(self.indices):
                        raise ValueError("No training conversation yields assistant tokens with this tokenizer's "
                                         "chat template: pass a chat dataset with assistant responses.")
                    continue
                empty_run = 0
                if self.max_tokens:
                    tokens = (tokens[0][: self.max_tokens], tokens[1][: self.max_tokens])
                yield tokens
            epoch += 1

    def __iter__(self):
        ids: list[int] = []
        mask: list[bool] = []
        for conv_ids, conv_mask in self._conversations():
            ids += conv_ids
            mask += conv_mask
            while len(ids) >= self.seq_len:
                yield {"input_ids": torch.tensor(ids[: self.seq_len]),
                       "loss_mask": torch.tensor(mask[: self.seq_len])}
                ids, mask = ids[self.seq_len:], mask[self.seq_len:]


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
    ids = ids.to(next(model.parameters()).device)
    out = [model(input_ids=ids[i: i + batch_size]).logits[:, :-1].argmax(-1) for i in range(0, len(ids), batch_size)]
    return torch.cat(out).cpu()


@torch.no_grad()
def top1_agreement(student, ids: torch.Tensor, mask: torch.Tensor, reference: torch.Tensor, batch_size: int = 8) -> float:
    """Share of assistant next-token positions where the student's argmax equals the target's."""
    was_training = student.training
    student.eval()
    try:
        sel = mask[:, 1:].cpu()
        hit = (_top1(student, ids, batch_size) == reference.cpu()) & sel
        return float(hit.sum()) / max(1, int(sel.sum()))
    finally:
        student.train(was_training)


def _warmup(step: int, warmup_steps: int) -> float:
    """Linear warmup, then constant: a schedule that does not depend on how long a resumed run goes on
    (the first step already learns, unlike ``constant_with_warmup``, whose step 0 has lr 0)."""
    return min(1.0, (step + 1) / max(1, warmup_steps))


def _freeze(student, cfg: DistillConfig) -> None:
    emb = student.get_input_embeddings().weight
    head = student.get_output_embeddings()
    frozen = {id(emb), id(head.weight)} if cfg.freeze_embeddings and head is not None else set()
    for p in student.parameters():
        p.requires_grad_(id(p) not in frozen)


class DistillTrainer(Trainer):
    """``Trainer`` with KL(target || student) on assistant positions and pickle-free checkpoints.

    ``teacher`` is a plain attribute, not part of ``model``: Trainer never optimizes it, DDP never wraps it.
    ``evaluate`` is top-1 agreement with the fp32 target's argmax on the held-out windows.
    """

    def __init__(self, *args, teacher, eval_windows: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                 autocast: bool, distill_record: dict, **kwargs):
        super().__init__(*args, **kwargs)
        self.teacher = teacher.eval().requires_grad_(False)  # on args.device already
        self.eval_windows = eval_windows
        self.autocast = autocast
        self.distill_record = distill_record
        self._positions = 0  # assistant positions trained on by this process since the last log

    # ---- loss / schedule / eval

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """KL(target || student) averaged over this process's positions whose next token is assistant text."""
        ids, sel = inputs["input_ids"], inputs["loss_mask"][:, 1:]
        self._positions += int(sel.sum())
        with torch.no_grad():
            t_logp = self.teacher(input_ids=ids).logits[:, :-1][sel].float().log_softmax(-1)
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            out = model(input_ids=ids)
        if not sel.any():  # a batch of prompt text only: nothing to learn (and no 0/0 from batchmean)
            loss = out.logits.sum() * 0.0
            return (loss, out) if return_outputs else loss
        s_logp = out.logits[:, :-1][sel].float().log_softmax(-1)
        loss = F.kl_div(s_logp, t_logp, log_target=True, reduction="batchmean")
        return (loss, out) if return_outputs else loss

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:
            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer if optimizer is not None else self.optimizer,
                functools.partial(_warmup, warmup_steps=self.args.warmup_steps))
        return self.lr_scheduler

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict:
        ids, mask, reference = self.eval_windows
        student = self.accelerator.unwrap_model(self.model)
        metrics = {f"{metric_key_prefix}_agreement": top1_agreement(student, ids, mask, reference,
                                                                    self.args.per_device_eval_batch_size)}
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:  # every rank logs the loss together (Trainer gathers it): count positions alike
            n = torch.tensor(self._positions, device=self.args.device)
            logs["assistant_positions"] = int(self.accelerator.reduce(n, "sum"))
            self._positions = 0
        super().log(logs, start_time)

    # ---- checkpoints without pickle: optimizer moments -> safetensors, small state -> JSON

    def _param_names(self) -> list[str]:
        name_of = {id(p): n for n, p in self.accelerator.unwrap_model(self.model).named_parameters()}
        return [name_of[id(p)] for g in self.optimizer.param_groups for p in g["params"]]

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return
        os.makedirs(output_dir, exist_ok=True)
        self.accelerator.unwrap_model(self.model).save_pretrained(output_dir, state_dict=state_dict)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(output_dir)
        # instead of torch.save(self.args): the distillation settings, as JSON
        atomic_write(Path(output_dir) / CONFIG_FILE,
                     lambda p: p.write_text(json.dumps(self.distill_record, indent=1)))

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        if not self.args.should_save:
            return
        from safetensors.torch import save_file

        names = self._param_names()
        sd = self.optimizer.state_dict()
        tensors = {}
        for i, name in enumerate(names):
            for key, value in sd["state"].get(i, {}).items():
                t = value if torch.is_tensor(value) else torch.tensor(value)
                tensors[f"{name}::{key}"] = t.detach().cpu().contiguous().clone()
        os.makedirs(output_dir, exist_ok=True)
        save_file(tensors, os.path.join(output_dir, OPTIMIZER_FILE))
        groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"}
                  | {"params": len(g["params"])} for g in sd["param_groups"]]
        index = {"format": _FORMAT, "param_names": names, "param_groups": groups,
                 "scheduler": self.lr_scheduler.state_dict()}
        atomic_write(Path(output_dir, SCHEDULER_FILE), lambda p: p.write_text(json.dumps(index, indent=1)))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if checkpoint is None:
            return
        from safetensors.torch import load_file

        index = json.loads(Path(checkpoint, SCHEDULER_FILE).read_text())
        names = self._param_names()
        if index["param_names"] != names:
            raise ValueError(f"{checkpoint} was trained with different trainable parameters (freeze_embeddings "
                             "changed?): resume with the same settings or pass overwrite=True / --overwrite.")
        device = self.args.device
        state: dict[int, dict] = {}
        for key, t in load_file(os.path.join(checkpoint, OPTIMIZER_FILE)).items():
            name, _, slot = key.rpartition("::")
            state.setdefault(names.index(name), {})[slot] = t if slot == "step" else t.to(device)
        groups, start = [], 0
        for g in index["param_groups"]:
            n = g["params"]
            g = dict(g, params=list(range(start, start + n)))
            start += n
            if isinstance(g.get("betas"), list):
                g["betas"] = tuple(g["betas"])
            groups.append(g)
        self.optimizer.load_state_dict({"state": state, "param_groups": groups})
        self.lr_scheduler.load_state_dict(index["scheduler"])

    def _rng_file(self, directory: str) -> str:
        return os.path.join(directory, f"rng_state_{self.args.process_index}.safetensors")

    def _save_rng_state(self, output_dir: str) -> None:
        import numpy as np
        from safetensors.torch import save_file

        tensors = {"cpu": torch.random.get_rng_state()}
        if torch.cuda.is_available():
            tensors["cuda"] = torch.cuda.get_rng_state()
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        meta = {"python": json.dumps(random.getstate()),
                "numpy": json.dumps([kind, keys.tolist(), pos, has_gauss, gauss])}
        os.makedirs(output_dir, exist_ok=True)
        save_file(tensors, self._rng_file(output_dir), metadata=meta)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        if checkpoint is None or not os.path.isfile(self._rng_file(checkpoint)):
            return
        import numpy as np
        from safetensors import safe_open

        with safe_open(self._rng_file(checkpoint), framework="pt") as f:
            meta = f.metadata()
            torch.random.set_rng_state(f.get_tensor("cpu"))
            if torch.cuda.is_available() and "cuda" in f:
                torch.cuda.set_rng_state(f.get_tensor("cuda"))
        version, state, gauss = json.loads(meta["python"])
        random.setstate((version, tuple(state), gauss))
        kind, keys, pos, has_gauss, cached = json.loads(meta["numpy"])
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


class _Budget(TrainerCallback):
    """Stops training (evaluating and saving first) when the wall-clock budget would be exceeded or on the
    first SIGINT/SIGTERM (a second one kills as usual). Every rank must stop at the same step, so the
    decision is a max over ranks each step (one tiny collective)."""

    def __init__(self, t0: float, budget_s: float | None, reserve_s: float):
        self.t0, self.budget_s, self.reserve_s = t0, budget_s, reserve_s
        self.step_times: list[float] = []
        self.reason: str | None = None
        self._signal = threading.Event()
        self._handlers: dict = {}
        self._step_start = self._save_start = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        if threading.current_thread() is threading.main_thread():
            def on_signal(signum, frame):
                self._signal.set()
                signal.signal(signum, self._handlers[signum])
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._handlers[sig] = signal.getsignal(sig)
                signal.signal(sig, on_signal)

    def on_train_end(self, args, state, control, **kwargs):
        for sig, h in self._handlers.items():
            signal.signal(sig, h)
        self._handlers.clear()

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.step_times.append(now - self._step_start)
        code = 2 if self._signal.is_set() else 0
        if self.budget_s is not None and now - self.t0 + max(self.step_times[-3:]) + self.reserve_s > self.budget_s:
            code = max(code, 1)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            flag = torch.tensor([code], device=args.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            code = int(flag.item())
        if code and state.global_step < state.max_steps:
            self.reason = "interrupted" if code == 2 else "time_budget"
            control.should_training_stop = control.should_evaluate = control.should_save = True
        self._save_start = now

    def on_save(self, args, state, control, **kwargs):  # eval + checkpoint time: keep that much in reserve
        self.reserve_s = max(self.reserve_s, 1.5 * (time.perf_counter() - self._save_start))


# ----------------------------------------------------------------------------------------------- helpers


def _describe(obj: Any) -> str:
    if isinstance(obj, (str, os.PathLike)):
        return str(obj)
    name = getattr(getattr(obj, "config", None), "_name_or_path", "") or getattr(obj, "name_or_path", "")
    return f"<{type(obj).__name__}{' ' + name if name else ''}>"


def _cfg_record(cfg: DistillConfig, world_size: int) -> dict:
    rec = {k: v for k, v in asdict(cfg).items() if k not in ("target", "dataset", "tokenizer", "output_dir")}
    rec.update(target=_describe(cfg.target), dataset=_describe(cfg.dataset), tokenizer=_describe(cfg.tokenizer),
               world_size=world_size)
    return rec


def checkpoint_dir(output_dir: str | os.PathLike) -> Path:
    """Where Trainer's resumable checkpoints of a run writing ``output_dir`` live (a sibling directory)."""
    out = Path(output_dir)
    return out.parent / f"{out.name}.checkpoints"


def _complete_checkpoints(ckpts: Path) -> list[Path]:
    found = [p for p in ckpts.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()] if ckpts.is_dir() else []
    return sorted((p for p in found if (p / TRAINER_STATE_FILE).is_file()), key=lambda p: int(p.name.split("-")[-1]))


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


# ---------------------------------------------------------------------------------------------- distill


def distill(cfg: DistillConfig, progress: bool = True) -> DistillResult:
    """Train (or resume) a ``num_layers`` student of ``cfg.target`` into ``cfg.output_dir``.

    Stops at ``max_steps``, when ``time_budget_s`` would be exceeded (leaving time for the final eval and
    save), or on SIGINT/SIGTERM, and always saves before returning. Under ``accelerate launch`` every
    process calls this; they train data-parallel and the main process writes. Leaves the global RNGs as
    they were (Trainer seeds them).
    """
    import numpy as np

    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_available() else []):
        try:
            return _distill(cfg, progress)
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


def _training_args(cfg: DistillConfig, ckpts: Path, progress: bool) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(ckpts), max_steps=cfg.max_steps or _NO_STEP_LIMIT, per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.batch_size, learning_rate=cfg.lr, warmup_steps=cfg.warmup_steps,
        weight_decay=cfg.weight_decay, adam_beta1=0.9, adam_beta2=0.95, max_grad_norm=cfg.grad_clip or 0.0,
        optim="adamw_torch", seed=cfg.seed, logging_steps=1, eval_strategy="steps", eval_steps=cfg.save_every,
        save_strategy="steps", save_steps=cfg.save_every, save_total_limit=2,
        report_to="none", disable_tqdm=not progress, remove_unused_columns=False, dataloader_pin_memory=False,
        include_num_input_tokens_seen="all", ddp_find_unused_parameters=False,
        use_cpu=not torch.cuda.is_available(), log_level="passive", log_level_replica="passive",
    )


def _distill(cfg: DistillConfig, progress: bool) -> DistillResult:
    t0 = time.perf_counter()
    _validate(cfg)
    out = Path(cfg.output_dir)
    ckpts = checkpoint_dir(out)
    if out.exists() and not cfg.overwrite and not (out / REPORT_FILE).is_file() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not a distilled student (no {REPORT_FILE}): choose a new "
                              "--output directory or pass --overwrite.")
    if (out / TRAINER_STATE_FILE).is_file() and not cfg.overwrite and not _complete_checkpoints(ckpts):
        raise FileExistsError(f"{out} holds a run of the earlier hand-written loop (its {TRAINER_STATE_FILE} is not "
                              "Trainer's): pass --overwrite to start afresh there, or a new --output.")
    # the process group (if launched on N processes) comes from TrainingArguments; make it before the checks
    args = _training_args(cfg, ckpts, progress)
    world = args.world_size
    with args.main_process_first(local=False, desc="checkpoint cleanup"):  # the main process cleans, then all look
        if args.should_save:
            if cfg.overwrite and ckpts.exists():
                shutil.rmtree(ckpts)
            # finish a swap of the student that a kill cut short; drop checkpoints a kill left half-written
            recover_directory(out, lambda d: (d / REPORT_FILE).is_file())
            whole = set(_complete_checkpoints(ckpts))
            for partial in (p for p in ckpts.glob("checkpoint-*") if p not in whole) if ckpts.is_dir() else ():
                shutil.rmtree(partial, ignore_errors=True)
        complete = [] if cfg.overwrite else _complete_checkpoints(ckpts)
    last = complete[-1] if complete else None
    saved = json.loads((last / CONFIG_FILE).read_text()) if last is not None else None

    target, tokenizer, dataset = _load(cfg)
    # errors that name the fix come before any slow work
    _check_num_layers(cfg.num_layers, _num_layers(target.config))
    _check_dataset(dataset)
    record = _cfg_record(cfg, world)
    if saved is not None:
        diff = {k: (saved.get(k), record[k]) for k in _RESUME_KEYS + ("target", "dataset")
                if saved.get(k) != record[k] and not str(record[k]).startswith("<")}
        if diff:
            raise ValueError(f"{ckpts} holds a run with different settings {diff} (saved, now): resume with the "
                             "same settings, or choose a new --output / pass --overwrite.")

    tokenize = _Tokenizer(tokenizer)
    eval_ids, eval_mask, train_idx, held_out = _split(dataset, tokenize, cfg.eval_sequences, cfg.seq_len, cfg.seed)
    reference = _top1(target, eval_ids, cfg.batch_size)  # the fp32 (as given) target's choices
    reference_dtype = str(target.dtype).removeprefix("torch.")
    student = build_student(target, cfg.num_layers)  # fp32 weights; a resume loads the checkpoint's into it
    student.config.use_cache = False
    train_target = target  # the caller's own model object is copied, never cast or moved
    if target.dtype != _DTYPES[cfg.target_dtype] or target.device != args.device:
        train_target = (copy.deepcopy(target) if target is cfg.target else target)
        train_target = train_target.to(device=args.device, dtype=_DTYPES[cfg.target_dtype])
    _freeze(student, cfg)
    n_student = sum(p.numel() for p in student.parameters())
    windows = _Windows(dataset, train_idx, tokenize, cfg.seq_len, cfg.seed, cfg.max_conversation_tokens)

    t_eval = time.perf_counter()
    initial = top1_agreement(student, eval_ids, eval_mask, reference, cfg.batch_size) if saved is None else None
    eval_s = time.perf_counter() - t_eval
    budget = _Budget(t0, cfg.time_budget_s, reserve_s=5.0 + 2 * eval_s)
    trainer = DistillTrainer(
        model=student, args=args, train_dataset=windows,
        eval_dataset=[{"input_ids": i, "loss_mask": m} for i, m in zip(eval_ids, eval_mask)], processing_class=tokenizer,
        callbacks=[budget], teacher=train_target, eval_windows=(eval_ids, eval_mask, reference),
        autocast=cfg.autocast, distill_record=record)
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    if progress:
        trainer.add_callback(_Progress())
    start_step = int(last.name.split("-")[-1]) if last is not None else 0
    over_budget = cfg.time_budget_s is not None and time.perf_counter() - t0 + budget.reserve_s > cfg.time_budget_s
    reached = cfg.max_steps is not None and start_step >= cfg.max_steps  # Trainer would still take one step
    stopped = "max_steps"
    if over_budget or reached:
        stopped = "max_steps" if reached else "time_budget"
        if last is not None:
            trainer._load_from_checkpoint(str(last))
            trainer.state = trainer.state.load_from_json(str(last / TRAINER_STATE_FILE))
        else:
            trainer.log({"eval_agreement": initial})
    else:
        if saved is None:  # evaluated above already: log it at step 0 instead of evaluating on start again
            trainer.add_callback(_LogInitial(initial))
        trainer.train(resume_from_checkpoint=str(last) if last is not None else None)
        stopped = budget.reason or "max_steps"
    state = trainer.state
    history = state.log_history
    losses = [[h["step"], h["loss"]] for h in history if "loss" in h]
    agreement = [[h["step"], h["eval_agreement"]] for h in history if "eval_agreement" in h]
    if not agreement or agreement[-1][0] != state.global_step:
        agreement.append([state.global_step, trainer.evaluate()["eval_agreement"]])
    positions = sum(int(h.get("assistant_positions", 0)) for h in history)
    steps_done = state.global_step - start_step
    meta = {"target": _describe(cfg.target), "num_layers": cfg.num_layers,
            "target_layers": _num_layers(target.config), "student_parameters": n_student,
            "eval_sequences": len(eval_ids), "eval_positions": int(eval_mask[:, 1:].sum()),
            "held_out_conversations": held_out, "train_conversations": len(train_idx),
            "trained_on": "assistant next-token positions of chat-templated conversations (prompts are context)",
            "target_dtype_for_training": cfg.target_dtype, "agreement_reference": f"{reference_dtype} target, argmax",
            "student_autocast_bf16": cfg.autocast, "trainer": "transformers.Trainer"}
    result = DistillResult(
        output_dir=str(out), checkpoint_dir=str(ckpts), step=state.global_step, steps_done=steps_done,
        stopped=stopped, initial_agreement=agreement[0][1], final_agreement=agreement[-1][1],
        loss_first=losses[0][1] if losses else None, loss_last=losses[-1][1] if losses else None,
        tokens_seen=int(state.num_input_tokens_seen), assistant_positions_seen=positions,
        seconds=round(time.perf_counter() - t0, 1),
        seconds_per_step=round(sum(budget.step_times) / len(budget.step_times), 3) if budget.step_times else None,
        world_size=world, global_batch=world * cfg.batch_size, meta=meta)
    if args.should_save:
        report = dict(result.to_dict(), agreement_history=agreement, loss_history=losses, config=record)

        def write(tmp: Path) -> None:
            trainer.accelerator.unwrap_model(trainer.model).save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / REPORT_FILE).write_text(json.dumps(report, indent=2))

        atomic_directory(out, write)
    trainer.accelerator.wait_for_everyone()
    return result


class _Progress(ProgressCallback):
    """Trainer's progress bar, with the loss and agreement on the bar instead of printed to stdout (where the
    CLI writes its JSON summary)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and logs:
            shown = {k: f"{logs[k]:.4g}" for k in ("loss", "eval_agreement") if isinstance(logs.get(k), float)}
            if shown:
                self.training_bar.set_postfix(shown)


class _LogInitial(TrainerCallback):
    """Puts the agreement measured before training into a fresh run's history (Trainer resets its state)."""

    def __init__(self, agreement: float):
        self.agreement = agreement

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0 and not any("eval_agreement" in h for h in state.log_history):
            state.log_history.append({"eval_agreement": self.agreement, "step": 0})


__all__ = ["DistillConfig", "DistillResult", "DistillTrainer", "build_student", "checkpoint_dir", "distill",
           "top1_agreement"]
