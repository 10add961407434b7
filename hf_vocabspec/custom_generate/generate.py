"""hf_vocabspec trimmed-vocabulary speculative decoding as a transformers ``custom_generate`` recipe.

    out = target.generate(**inputs, custom_generate="<this repo>", trust_remote_code=True)

loads the trimmed drafter stored in this same repository (once per process) and runs
``target.generate(..., assistant_model=drafter)``: drafting in the kept vocabulary, verification by the
target, output exactly the target's. Needs ``pip install hf_vocabspec``. Pass ``drafter=<repo id, path
or TrimmedDrafter>`` to use another drafter.

transformers also attaches this recipe to the DRAFTER when the drafter itself is loaded from this repo
with ``trust_remote_code=True``; then it simply runs the drafter's own ``generate``. hf_vocabspec is
imported lazily (inside try/except, see _package) so that loading the drafter never requires the package.
"""

from __future__ import annotations

from transformers import GenerationMixin


def _package():
    """hf_vocabspec, imported only when this recipe drives a target (try/except keeps it optional for
    transformers' import check, so loading the drafter alone never needs the package)."""
    try:
        import hf_vocabspec  # registers TrimmedDrafter and the trimmed candidate generator
        import hf_vocabspec.hub
    except ImportError:
        raise ImportError("This custom_generate recipe drafts with hf_vocabspec: `pip install hf_vocabspec`.") from None
    return hf_vocabspec

DRAFTER_REPO = "{{DRAFTER_REPO}}"  # filled in by hf_vocabspec.hub.write_custom_generate
DRAFTER_MODEL_TYPE = "hf_vocabspec_trimmed_drafter"
_LOADED: dict = {}


def generate(model, drafter=None, drafter_revision=None, **kwargs):
    """``model.generate(**kwargs)`` with this repo's trimmed drafter as the assistant."""
    if getattr(model.config, "model_type", None) == DRAFTER_MODEL_TYPE:  # the drafter drafting for HF
        return type(model).generate(model, **kwargs)
    hf_vocabspec = _package()
    if kwargs.get("assistant_model") is not None:
        raise ValueError("custom_generate from an hf_vocabspec drafter repo brings its own assistant: "
                         "drop `assistant_model`, or pass `drafter=` to choose another trimmed drafter.")
    kwargs.pop("assistant_model", None)
    if not isinstance(drafter, hf_vocabspec.TrimmedDrafter):
        name = drafter or DRAFTER_REPO
        key = (name, drafter_revision, str(model.device))
        if key not in _LOADED:
            extra = {"revision": drafter_revision} if drafter_revision else {}
            _LOADED[key] = hf_vocabspec.hub.load_drafter(name, target=model, **extra).to(model.device).eval()
        drafter = _LOADED[key]
    return GenerationMixin.generate(model, assistant_model=drafter, **kwargs)
