"""Action tokenizer (256 bins on the last vocabulary ids) and the local BPE tokenizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policies.autoregressive.action_tokenizer import NUM_BINS, ActionTokenizer, BinScheme
from policies.autoregressive.local_vlm import build_local_tokenizer

VOCAB = 1000


def _grid() -> torch.Tensor:
    """Dense values in [-1, 1] including both ends and every uniform bin edge."""
    edges = torch.linspace(-1.0, 1.0, NUM_BINS + 1, dtype=torch.float64)
    return torch.cat([torch.linspace(-1.0, 1.0, 20001, dtype=torch.float64), edges]).float()


def test_uniform_round_trip_within_half_a_bin() -> None:
    tok = ActionTokenizer(VOCAB)
    values = _grid()
    ids = tok.encode(values)
    assert ids.dtype == torch.int64
    assert int(ids.min()) == VOCAB - NUM_BINS and int(ids.max()) == VOCAB - 1  # exactly the last 256 ids
    assert torch.unique(ids).numel() == NUM_BINS  # every bin is reachable
    error = (tok.decode(ids) - values).abs().max().item()
    assert error <= 1.0 / NUM_BINS + 1e-6
    assert tok.max_error == pytest.approx(1.0 / NUM_BINS)
    assert error > 0.9 / NUM_BINS  # the bound is tight: bins really are 2/256 wide
    decoded = tok.decode(tok.encode(values.sort().values))
    assert bool((decoded[1:] >= decoded[:-1]).all())  # decoding is monotonic in the action


def test_uniform_bin_centers_and_id_order() -> None:
    tok = ActionTokenizer(VOCAB)
    centers = tok.bin_centers()
    assert centers[0].item() == pytest.approx(-1 + 1 / NUM_BINS)
    assert centers[-1].item() == pytest.approx(1 - 1 / NUM_BINS)
    assert tok.encode(torch.tensor([-1.0])).item() == VOCAB - NUM_BINS
    assert tok.encode(torch.tensor([1.0])).item() == VOCAB - 1
    assert tok.encode(torch.tensor([0.0])).item() == VOCAB - NUM_BINS + 128  # 0 is the edge of bins 127 | 128


def test_out_of_range_actions_are_clipped_and_counted() -> None:
    tok = ActionTokenizer(VOCAB)
    actions = torch.tensor([[-3.0, -1.0, 0.2], [1.0, 1.5, 1.0001]])
    ids = tok.encode(actions)
    assert tok.num_clipped == 3 and tok.num_encoded == 6
    assert ids[0, 0] == ids[0, 1] == VOCAB - NUM_BINS  # -3 clipped to -1
    assert ids[1, 1] == ids[1, 2] == VOCAB - 1
    tok.encode(torch.zeros(4))
    assert tok.num_clipped == 3 and tok.num_encoded == 10
    tok.reset_counters()
    assert tok.num_clipped == 0 and tok.num_encoded == 0


def test_openvla_scheme_matches_numpy_digitize() -> None:
    """OpenVLA maps a to vocab - np.digitize(a, linspace(-1, 1, 256)) and decodes to interval centers."""
    tok = ActionTokenizer(32000, scheme=BinScheme.OPENVLA)
    values = _grid()
    edges = np.linspace(-1, 1, NUM_BINS)
    expected_ids = 32000 - np.digitize(values.double().numpy(), edges)
    ids = tok.encode(values)
    assert np.array_equal(ids.numpy(), expected_ids)
    centers = (edges[:-1] + edges[1:]) / 2
    expected_values = centers[np.clip(32000 - ids.numpy() - 1, 0, NUM_BINS - 2)]
    np.testing.assert_allclose(tok.decode(ids).numpy(), expected_values, atol=1e-6)
    assert (tok.decode(ids) - values).abs().max().item() <= tok.max_error + 1e-6


def test_invalid_ids_and_values_raise() -> None:
    tok = ActionTokenizer(VOCAB)
    with pytest.raises(ValueError, match=r"\[744, 999\]"):
        tok.decode(torch.tensor([5, VOCAB - 1]))
    with pytest.raises(ValueError, match="NaN"):
        tok.encode(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="num_bins"):
        ActionTokenizer(100)


def test_local_tokenizer_puts_action_ids_last_and_never_emits_them() -> None:
    tokenizer = build_local_tokenizer()
    vocab = tokenizer.vocab_size
    assert len(tokenizer) == vocab
    assert tokenizer.convert_ids_to_tokens(vocab - NUM_BINS) == "<act_0>"
    assert tokenizer.convert_ids_to_tokens(vocab - 1) == f"<act_{NUM_BINS - 1}>"
    ids = tokenizer("In: What action should the robot take to grab <act_5> ünïcode 42?\nOut:",
                    add_special_tokens=False)["input_ids"]
    assert max(ids) < vocab - NUM_BINS
    assert tokenizer.decode(ids) == "In: What action should the robot take to grab <act_5> ünïcode 42?\nOut:"
    assert tokenizer.pad_token_id == 0 and tokenizer.bos_token_id == 1
