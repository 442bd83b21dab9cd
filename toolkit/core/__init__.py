"""The torch-free building blocks both sides share: the manifest, the variant catalogue and the declared runtimes
and providers, graph declarations, the tokenizer and text preparation, the decoding loop, the corpus, files written
atomically, errors. Imports no runtime: the runtimes import core, never the other way."""
