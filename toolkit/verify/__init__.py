"""`tk verify`: the exported graphs against PyTorch (run), case by case (checks, compare), reported (report,
render) and recorded (record); attention: the attention-weight outputs; localize: the first node where two
runs part; int8_layers: which layers int8 may quantise. Needs torch (the reference side)."""
