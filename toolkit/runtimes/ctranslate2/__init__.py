"""CTranslate2: a tk Transformer converted to CTranslate2 (spec.py, hf_spec.py), stored in its model directory (toolkit.convert.ctranslate2:
`tk export DIR --ctranslate2`) and run as `--runtime ctranslate2` (engine.py; runtime.py declares it in the registry).
Torch-free; ctranslate2 is imported only when used. Importers name the module that holds what they use.
"""
