"""evaluation.data: the one held-out rule every tool splits a dataset by."""

from __future__ import annotations

from datasets import Dataset

from hf_vocabspec.evaluation.data import MIN_HELD_OUT, count_split, min_held_out


def _ds(n: int) -> Dataset:
    return Dataset.from_list([{"i": i} for i in range(n)])


def test_held_out_rule_keeps_500_or_a_fifth_back():
    assert min_held_out(17_671) == MIN_HELD_OUT == 500  # ShareGPT: 500 whatever the tool
    assert min_held_out(2_026) == 405 and min_held_out(4) == 0
    counted, held = count_split(_ds(3000), 4000)  # asks for more than there is: 500 stay held out
    assert (len(counted), len(held)) == (2500, 500)
    assert [r["i"] for r in held][:2] == [2500, 2501]  # counted first, held out after: disjoint, in order
    counted, held = count_split(_ds(100), 90)  # a small dataset still keeps a fifth back (the demo kept none)
    assert (len(counted), len(held)) == (80, 20)
    counted, held = count_split(_ds(3000), 1000)  # enough left: exactly what was asked
    assert (len(counted), len(held)) == (1000, 2000)
