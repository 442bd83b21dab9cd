"""The torch-free building blocks both sides share: the manifest and its variants, graph declarations,
the tokenizer and text preparation, the decoding loop, the corpus, files written atomically, errors."""
