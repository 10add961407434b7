"""RDK: kernel algebra, persistence, fitting, and losslessness of out-of-vocabulary sampling.

Lossless checks reuse test_lossless: 2,000 sampled generations, marginals of the first two tokens vs
the EXACT target marginals, chi-square p >= 1e-3; a pruned token must appear at the target's rate
(|z| < 4); and a deliberately wrong q (RDK draws verified against vanilla q') must FAIL the same check.
"""

from __future__ import annotations

import pytest
import torch
from marginals import PROMPT, check_detected, check_lossless, pruned_drafter
from scipy import stats
from tiny import VOCAB, hand_kernel, make_pair

import hf_vocabspec
from hf_vocabspec import TrimmedDrafter, VocabularyMapError
from hf_vocabspec.rdk import (
    RDKKernel,
    collect_calibration,
    drafter_kernel,
    embedding_prior_kernel,
    expected_acceptance,
    fit_rdk_kernel,
    identity_kernel,
    score_kernels,
)


def random_sequences(n=40, length=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (length,), generator=g) for _ in range(n)]


@pytest.fixture(scope="module")
def pair():
    target, base = make_pair("llama", seed=0, head_scale=12.0)
    drafter = hf_vocabspec.trim_drafter(base, list(range(0, VOCAB, 2)) + [1, 3])
    return target, base, drafter


@pytest.fixture(scope="module")
def fitted(pair):
    target, _, drafter = pair
    calibration = collect_calibration(target, random_sequences(), top=32, progress=False)
    return fit_rdk_kernel(calibration, drafter.d2t, num_targets=4, min_support=0.1)  # tiny data: low bar


def test_redistribute_is_exact_dense_product(pair, fitted):
    _, base, drafter = pair
    prior = embedding_prior_kernel(base.get_input_embeddings().weight, drafter.d2t, pruned_mass=0.2,
                                   num_targets=4, progress=False)
    q = torch.rand(5, drafter.d2t.numel()).softmax(-1)
    for kernel in (fitted, prior, identity_kernel(drafter.d2t, VOCAB, 4)):
        dense = kernel.dense()
        assert torch.allclose(dense.sum(1), torch.ones(dense.shape[0]), atol=1e-5)
        assert torch.allclose(kernel.redistribute(q), q @ dense, atol=1e-6)
        assert torch.allclose(kernel.redistribute(q).sum(-1), torch.ones(5), atol=1e-5)
    # kept tokens only receive mass from themselves; pruned tokens do receive mass
    kept = torch.zeros(VOCAB, dtype=torch.bool)
    kept[drafter.d2t] = True
    dense = fitted.dense()
    assert torch.equal(dense[:, kept].count_nonzero(1), torch.ones(drafter.d2t.numel(), dtype=torch.long))
    assert float(dense[:, ~kept].sum()) > 0.5
    assert identity_kernel(drafter.d2t, VOCAB).moved_mass == 0


def test_sample_follows_kernel_rows(pair):
    _, _, drafter = pair
    kernel = hand_kernel(drafter, [5, 7, 9], moved=0.45)
    torch.manual_seed(0)
    idx = torch.full((6000,), 7, dtype=torch.long)
    draws = kernel.sample(idx)
    row = kernel.dense()[7]
    observed = torch.bincount(draws, minlength=VOCAB)[row > 0].double()
    assert observed.sum() == 6000  # nothing outside the row's support
    expected = row[row > 0].double()
    assert stats.chisquare(observed.numpy(), (expected / expected.sum() * 6000).numpy()).pvalue >= 1e-3
    wrong = torch.tensor([0.25, 0.25, 0.25, 0.25]) * 6000  # a law the draws do NOT follow is rejected
    assert stats.chisquare(observed.numpy(), wrong.numpy()).pvalue < 1e-3


def test_simplex_projection_and_fit_never_below_vanilla_on_holdout(pair, fitted):
    from hf_vocabspec.rdk import _project_rows_to_simplex

    w = torch.tensor([[0.9, 0.6, -0.2], [0.1, 0.1, 5.0]])
    allowed = torch.tensor([[True, True, True], [True, True, False]])
    proj = _project_rows_to_simplex(w, allowed)
    assert torch.allclose(proj.sum(1), torch.ones(2)) and bool((proj >= 0).all()) and proj[1, 2] == 0
    assert torch.allclose(proj[0], torch.tensor([0.65, 0.35, 0.0]))
    held = fitted.info["holdout_acceptance_by_shrink"]
    assert held[str(fitted.info["shrink"])] >= held["0.0"]  # 0.0 = vanilla is always a candidate


def test_validate_names_the_problem(pair):
    _, _, drafter = pair
    good = hand_kernel(drafter, [5, 7])
    bad_sum = RDKKernel(good.d2t, good.targets, good.weights * 0.5, VOCAB)
    with pytest.raises(ValueError, match="sum to 1"):
        bad_sum.validate()
    onto_kept = RDKKernel(good.d2t, torch.full_like(good.targets, int(drafter.d2t[3])), good.weights, VOCAB)
    with pytest.raises(ValueError, match="kept tokens"):
        onto_kept.validate()
    with pytest.raises(ValueError, match="shapes"):
        RDKKernel(good.d2t[:-1], good.targets, good.weights, VOCAB).validate()
    with pytest.raises(ValueError, match="token ids"):
        RDKKernel(good.d2t, good.targets + VOCAB, good.weights, VOCAB).validate()
    with pytest.raises(ValueError, match="pruned_mass"):
        embedding_prior_kernel(torch.randn(VOCAB, 8), drafter.d2t, pruned_mass=1.0)


def test_kernel_file_and_checkpoint_round_trip(pair, fitted, tmp_path):
    target, base, _ = pair
    drafter = hf_vocabspec.trim_drafter(base, list(range(0, VOCAB, 2)) + [1, 3])
    fitted.save(tmp_path / "kernel.safetensors")
    loaded = RDKKernel.load(tmp_path / "kernel.safetensors")
    assert torch.equal(loaded.weights, fitted.weights) and torch.equal(loaded.targets, fitted.targets)
    (tmp_path / "junk.safetensors").write_bytes((tmp_path / "kernel.safetensors").read_bytes()[:40])
    with pytest.raises(Exception):
        RDKKernel.load(tmp_path / "junk.safetensors")

    drafter.set_rdk_kernel(loaded)
    drafter.save_pretrained(tmp_path / "d")
    again = TrimmedDrafter.from_pretrained(tmp_path / "d")
    assert again.config.rdk["num_targets"] == 4 and again.use_rdk
    assert torch.equal(drafter_kernel(again).weights, drafter_kernel(drafter).weights)
    assert not list(tmp_path.glob("d/*.bin")) and not list(tmp_path.glob("d/*.pt"))  # safetensors only
    # the code shipped for trust_remote_code: the configuration and modeling modules alone (torch + transformers only)
    assert sorted(p.name for p in (tmp_path / "d").glob("*.py")) == ["configuration.py", "modeling.py"]

    # the kernel must belong to this drafter's kept vocabulary
    other = hf_vocabspec.trim_drafter(base, list(range(1, VOCAB, 2)) + [0, 2])
    with pytest.raises(VocabularyMapError, match="another kept vocabulary"):
        other.set_rdk_kernel(loaded)

    # a checkpoint whose config announces a kernel that the weights lack is refused
    from safetensors.torch import load_file, save_file

    weights = load_file(tmp_path / "d" / "model.safetensors")
    weights.pop("rdk_weights")
    save_file(weights, tmp_path / "d" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(VocabularyMapError, match="rdk_weights"):
        TrimmedDrafter.from_pretrained(tmp_path / "d")

    drafter.set_rdk_kernel(None)
    assert drafter_kernel(drafter) is None and "rdk_weights" not in drafter.state_dict()


def test_fitted_and_prior_kernels_raise_expected_acceptance(pair, fitted):
    target, base, drafter = pair
    prior = embedding_prior_kernel(base.get_input_embeddings().weight, drafter.d2t, pruned_mass=0.2,
                                   num_targets=4, progress=False)
    held_out = random_sequences(n=10, seed=1)
    for q_source in (None, drafter):  # target-restricted proxy and the real drafter
        scores = score_kernels(target, held_out, {"vanilla": identity_kernel(drafter.d2t, VOCAB, 4),
                                                  "fitted": fitted, "prior": prior},
                               drafter=q_source, progress=False)
        assert scores["fitted"] > scores["vanilla"] + 0.05, scores
    assert fitted.info["shrink"] > 0  # the held-out check kept the moved mass
    assert fitted.info["fit_positions"] == 32 * 40  # 80% of 40 sequences x 40 positions
    assert fitted.info["train_acceptance_fitted"] > fitted.info["train_acceptance_vanilla"] + 0.05
    # expected_acceptance is the overlap of two distributions
    p = torch.tensor([0.5, 0.5, 0.0])
    assert float(expected_acceptance(p, torch.tensor([0.25, 0.25, 0.5]))) == pytest.approx(0.5)


@pytest.fixture(scope="module")
def rdk_pair():
    target, drafter, probe = pruned_drafter("llama")
    pruned = [t for t in range(VOCAB) if t not in set(drafter.d2t.tolist())]
    towards = [probe] + [t for t in pruned if t != probe][:2]
    drafter.set_rdk_kernel(hand_kernel(drafter, towards))
    return target, drafter, probe


@pytest.mark.parametrize("batch", [1, 50])
def test_rdk_sampling_t1_is_lossless_and_proposes_pruned_tokens(rdk_pair, batch):
    """Batch 1 and 50 rows of one call (the engine serves RDK at every batch size)."""
    target, drafter, probe = rdk_pair
    check_lossless(target, drafter, {}, pruned_probe=probe, batch=batch)
    assert drafter.last_speculation_stats.pruned_proposed > 0


def test_rdk_sampling_with_fitted_kernel_and_warpers_is_lossless():
    target, drafter, probe = pruned_drafter("gemma3")
    calibration = collect_calibration(target, random_sequences(n=24), top=32, progress=False)
    drafter.set_rdk_kernel(fit_rdk_kernel(calibration, drafter.d2t, num_targets=3))
    assert drafter_kernel(drafter).moved_mass > 0.01
    check_lossless(target, drafter, {"temperature": 0.7, "top_k": 20, "top_p": 0.9})


@pytest.mark.parametrize("batch", [1, 50])
def test_rdk_with_wrong_q_is_detected(rdk_pair, monkeypatch, batch):
    """Power check: RDK draws verified against the vanilla q' (pruned tokens at q=0) must fail."""
    target, drafter, probe = rdk_pair

    def vanilla_q(self, q_draft):
        out = q_draft.new_zeros((*q_draft.shape[:-1], self.vocab_size))
        out[..., self.d2t] = q_draft
        return out

    monkeypatch.setattr(RDKKernel, "redistribute", vanilla_q)
    check_detected(target, drafter, {}, pruned_probe=probe, batch=batch)


def test_rdk_is_inert_under_greedy_and_switchable(rdk_pair):
    target, drafter, _ = rdk_pair
    ref = target.generate(PROMPT, do_sample=False, max_new_tokens=20)
    out = target.generate(PROMPT, do_sample=False, max_new_tokens=20, assistant_model=drafter)
    assert torch.equal(ref, out) and drafter.last_speculation_stats.pruned_proposed == 0
    drafter.use_rdk = False
    try:
        torch.manual_seed(0)
        target.generate(PROMPT, do_sample=True, max_new_tokens=30, min_new_tokens=30, assistant_model=drafter)
        assert drafter.last_speculation_stats.pruned_proposed == 0
    finally:
        drafter.use_rdk = True


def test_cli_rdk_fit_prior_on_the_drafter_trim_made_without_target(cli_model, tmp_path, capsys):
    """Issue #38: `rdk-fit my-drafter --method prior` on the drafter the README's `trim` line made (no --target) said
    "does not record its target". The prior needs only the tokenizer, which trim saves with the drafter; --method
    fitted needs the target's distributions: it says so in one line (exit 2), and runs once trim recorded --target."""
    import json

    from hf_vocabspec.cli import main

    model, chats = cli_model
    drafter = tmp_path / "my-drafter"
    trim = ["trim", "--drafter", str(model), "--dataset", str(chats), "--k", "40", "--dtype", "float32"]
    assert main([*trim, "--output", str(drafter)]) == 0
    assert TrimmedDrafter.from_pretrained(drafter).config.target_model is None
    capsys.readouterr()
    assert main(["rdk-fit", str(drafter), "--method", "prior", "--dataset", str(chats)]) == 0
    assert json.loads(capsys.readouterr().out)["kernel"] == "prior"
    assert TrimmedDrafter.from_pretrained(drafter).config.rdk["method"] == "prior"
    capsys.readouterr()
    assert main(["rdk-fit", str(drafter), "--dataset", str(chats), "--sequences", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hf-vocabspec rdk-fit: error: --method fitted") and len(err.strip().splitlines()) == 1
    assert "pass --target" in err and "or use --method prior" in err
    recorded = tmp_path / "recorded"
    assert main([*trim, "--target", str(model), "--output", str(recorded)]) == 0
    assert TrimmedDrafter.from_pretrained(recorded).config.target_model == str(model)
    capsys.readouterr()
    assert main(["rdk-fit", str(recorded), "--dataset", str(chats), "--sequences", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["kernel"] != "prior"
