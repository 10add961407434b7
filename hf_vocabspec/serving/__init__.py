"""Serving a trimmed drafter in other engines, from the same saved folder.

``vllm_config`` (the drafter's config as vLLM reads it), ``vllm_model`` (the drafter as a vLLM model: vLLM's own body,
the kept head rows) and ``vllm_plugin`` (the ``vllm.general_plugins`` entry point that registers both). Each imports
only vLLM, torch, transformers and the files shipped with every checkpoint (``configuration``, ``modeling``); nothing
here is imported by the rest of the package.
"""
