"""OpenVINO (its CPU plugin), every piece of it in this package:

- engine.py   the exported graphs compiled by OpenVINO, behind tk's runner and step-backend interfaces
- runtime.py  its declaration in the runtime registry (toolkit.runtimes.registry)

Imports numpy and (lazily) openvino, never torch: this is a deployment path. Importers name the module that holds
what they use.
"""
