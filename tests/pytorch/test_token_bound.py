"""The ids export and verify feed a model's graphs at random: below the smaller vocabulary where the two sides have
their own, so a model whose target vocabulary is the smaller is never fed an id its decoder cannot embed."""

from types import SimpleNamespace

from toolkit.pytorch.registry import token_bound


def test_random_ids_stay_below_the_smaller_of_two_vocabularies():
    assert token_bound(SimpleNamespace(vocab_size=300, decoder_vocab_size=120)) == 120
    assert token_bound(SimpleNamespace(vocab_size=90, decoder_vocab_size=120)) == 90
    assert token_bound(SimpleNamespace(vocab_size=300)) == 300  # one vocabulary
    assert token_bound(SimpleNamespace()) == 2  # a model without one (a module graph)


def test_export_and_verify_ask_the_one_bound():
    from toolkit.pytorch import export
    from toolkit.verify import localize, run

    for module in (export, run, localize):
        source = open(module.__file__, encoding="utf-8").read()
        assert "token_bound(cfg)" in source and 'getattr(cfg, "vocab_size"' not in source, module.__name__
