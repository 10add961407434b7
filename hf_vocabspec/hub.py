"""Trimmed drafters on the Hugging Face Hub: push with a model card, load with compatibility checks."""

from __future__ import annotations

from pathlib import Path

from .drafter import MODEL_TYPE, TrimmedDrafter, VocabularyMapError, tokenizer_sha256

TEMPLATE = Path(__file__).resolve().parent.parent / "model_cards" / "drafter_card.md"


def build_model_card(drafter: TrimmedDrafter, repo_id: str = "<repo-id>", license: str | None = None):
    """A ``huggingface_hub.ModelCard`` from ``model_cards/drafter_card.md`` and the drafter's config."""
    from huggingface_hub import ModelCard, ModelCardData

    cfg = drafter.config
    base = cfg.base_drafter if cfg.base_drafter and not str(cfg.base_drafter).startswith(("/", "offline:")) else None
    selection = cfg.selection or {}
    datasets = [d for d in [selection.get("dataset")] if d and not str(d).startswith(("offline:", "/"))]
    data = ModelCardData(
        library_name="transformers", tags=["hf_vocabspec", "speculative-decoding", "draft-model", "trimmed-vocabulary"],
        base_model=base, datasets=datasets or None, license=license, pipeline_tag="text-generation",
        draft_vocab_size=cfg.draft_vocab_size, target_model=cfg.target_model,
    )
    return ModelCard.from_template(
        data, template_path=str(TEMPLATE), model_name=repo_id.split("/")[-1], repo_id=repo_id,
        draft_vocab_size=f"{cfg.draft_vocab_size:,}", vocab_size=f"{cfg.vocab_size:,}",
        kept_share=f"{cfg.draft_vocab_size / cfg.vocab_size:.1%}", base_drafter=cfg.base_drafter or "unknown",
        target_model=cfg.target_model or "<target model>", tokenizer_sha256=cfg.target_tokenizer_sha256 or "not recorded",
        selection=", ".join(f"{k}={v}" for k, v in selection.items()) or "not recorded",
        vocab_map_sha256=cfg.vocab_map_sha256, license=license or "see the base drafter",
    )


def push_drafter_to_hub(drafter: TrimmedDrafter, repo_id: str, *, tokenizer=None, token: str | None = None,
                        private: bool = False, license: str | None = None) -> str:
    """Push weights (safetensors, map inside), config, tokenizer and a generated model card; return the URL."""
    from huggingface_hub import create_repo

    url = create_repo(repo_id, token=token, private=private, exist_ok=True)
    drafter.push_to_hub(repo_id, token=token, commit_message="Upload trimmed drafter (hf_vocabspec)")
    if tokenizer is not None:
        tokenizer.push_to_hub(repo_id, token=token, commit_message="Upload tokenizer")
    build_model_card(drafter, repo_id, license).push_to_hub(repo_id, token=token, commit_message="Add model card")
    return str(url)


def load_drafter(repo_or_path: str, *, target=None, tokenizer=None, **kwargs) -> TrimmedDrafter:
    """Load a TrimmedDrafter and refuse it when it does not belong to ``target`` / ``tokenizer``."""
    from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(repo_or_path, **{k: v for k, v in kwargs.items() if k in ("revision", "token")})
    except (RepositoryNotFoundError, EntryNotFoundError, OSError) as err:
        raise OSError(f"Could not load a drafter from {repo_or_path!r}: check the repo id / path and your access "
                      f"token ({type(err).__name__}: {str(err).splitlines()[0]})") from err
    if getattr(config, "model_type", None) != MODEL_TYPE:
        raise VocabularyMapError(
            f"{repo_or_path!r} holds a {getattr(config, 'model_type', '?')!r} model, not an hf_vocabspec trimmed "
            "drafter (no vocabulary map). Trim it first: hf_vocabspec.trim_drafter(model, keep_token_ids)."
        )
    drafter = TrimmedDrafter.from_pretrained(repo_or_path, **kwargs)
    if target is not None and target.config.get_text_config().vocab_size != drafter.config.vocab_size:
        raise VocabularyMapError(
            f"This drafter was trimmed for a {drafter.config.vocab_size:,}-token vocabulary "
            f"({drafter.config.target_model or 'unknown target'}), but the target has "
            f"{target.config.get_text_config().vocab_size:,}: use a drafter trimmed for this target."
        )
    recorded = drafter.config.target_tokenizer_sha256
    if tokenizer is not None and recorded and tokenizer_sha256(tokenizer) != recorded:
        raise VocabularyMapError(
            "The tokenizer's token->id table differs from the one this drafter was trimmed with "
            f"({drafter.config.target_model or 'unknown target'}): draft ids would map to the wrong tokens."
        )
    return drafter
