"""Evaluation and experiment tooling, kept apart from the core users import and checkpoints ship:
the side-by-side benchmark (``benchmark``, ``rdk_benchmark``), exact expected acceptance (``acceptance``),
the held-out split and prompts (``data``), same-tokenizer drafter distillation (``distill``) and the
offline real models and text (``offline``). The core never imports this package."""
