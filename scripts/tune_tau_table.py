"""Render `hf-vocabspec tune --validate` reports (tune.json) as the README's predicted-vs-measured tau table.

Usage: python scripts/tune_tau_table.py results/tune-*/tune.json > table.md
"""

from __future__ import annotations

import json
import sys

from hf_vocabspec.evaluation._format import cell as _f
from hf_vocabspec.evaluation._format import plus_minus as _pm


def render(reports: list[dict]) -> str:
    lines = ["| pair (target <- drafter) | mode | setting | tau predicted | tau measured (+- s.e.) | predicted / measured | "
             "drafts/round predicted | measured | x target only predicted | measured |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    summary = []
    for rep in reports:
        v = rep.get("validation")
        if not v:
            continue
        pair = f"{rep['target'].removeprefix('offline:')} <- {rep['drafter'].removeprefix('offline:')}"
        tuned_k = rep["result"]["k"]
        rows = sorted((r for r in v["rows"] if r["k"] == tuned_k),
                      key=lambda r: (r["confidence_threshold"] > 0, r["num_draft_tokens"]))
        worst = 0.0
        for r in rows:
            ratio = r["predicted_tau"] / r["mean_accepted_length"] if r.get("predicted_tau") and r["mean_accepted_length"] else None
            if ratio is not None and r["confidence_threshold"] == 0:
                worst = max(worst, abs(ratio - 1))
            mark = " (tuned)" if r["method"] == v["tuned"] else ""
            lines.append(f"| {pair} | {rep['mode']} | {r['method']}{mark} | {_f(r.get('predicted_tau'), '.2f')} | "
                         f"{_f(r['mean_accepted_length'], '.2f')}{_pm(r.get('tau_standard_error'))} | "
                         f"{_f(ratio, '.3f')} | "
                         f"{_f(r.get('predicted_mean_drafts'), '.2f')} | {_f(r['mean_drafts'], '.2f')} | "
                         f"{_f(r.get('predicted_speedup'), '.2f')} | {_f(r['speedup'], '.2f')} |")
        summary.append(f"- {pair}, {rep['mode']}: tuned {v['tuned']} (context tokens "
                       f"{'on' if v['context_tokens'] else 'off'}) ranks {v['rank']} of {v['of']} measured settings, "
                       f"{v['tuned_vs_best']:.1%} of the best measured; largest |predicted/measured - 1| of tau at a "
                       f"constant L: {worst:.1%}; scored on {rep['conversations']} held-out conversations, measured on "
                       + ("the same prompts" if v.get("validated_on") == "scored" else "other held-out prompts")
                       + f" ({sum(r['rounds'] for r in rows if r.get('rounds'))} rounds at this k); other processes used "
                       f"{_f(rep['measured'].get('other_processes_cores'), '.2f')} cores while timing")
    return "\n".join(lines + [""] + summary) + "\n"


if __name__ == "__main__":
    print(render([json.loads(open(p).read()) for p in sys.argv[1:]]), end="")
