"""How `tk verify` reads transformers' generate output: a pad id the model chose is a token, padding after the end is
not (a T5 translation that emitted its pad id, the start token too, was compared as if the token were not there)."""

import pytest

from toolkit.verify.hf_parity import generated_tokens

PAD, END = 0, 1


@pytest.mark.timeout(30)
def test_a_pad_id_the_model_emitted_stays_in_a_row_without_the_end_token():
    # generate's row: start (T5's pad), then tokens up to the length limit, one of them the pad id
    assert generated_tokens([PAD, 3, 8, PAD, 27, 3], END) == [3, 8, PAD, 27, 3]


@pytest.mark.timeout(30)
def test_a_row_ends_at_its_first_end_token_and_its_padding_goes():
    assert generated_tokens([PAD, 3, PAD, 8, END, PAD, PAD], END) == [3, PAD, 8]
    assert generated_tokens([PAD, END, PAD], END) == []
