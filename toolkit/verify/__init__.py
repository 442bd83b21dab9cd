"""`tk verify`: the exported graphs against PyTorch (run), case by case (checks, compare), reported (report,
render) and recorded (record); attention: the attention-weight outputs. Needs torch (the reference side)."""
