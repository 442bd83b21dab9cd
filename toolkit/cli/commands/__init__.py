"""One module per command (attention.py holds `tk attention` and `tk plot`)."""
