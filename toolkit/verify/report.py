"""The report `tk verify` builds: one Row per comparison, and the Report that holds them with what was compared."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from toolkit.runtimes.registry import DEFAULT as DEFAULT_RUNTIME


@dataclass
class Row:
    check: str  # static | sweep | optimizer | decode | translation | batch (the same alone and in a padded batch)
    graph: str
    variant: str
    provider: str
    case: str
    output: str
    max_abs: float = 0.0
    max_rel: float = 0.0
    outside: float = 0.0  # fraction of elements outside atol + rtol * |ref|
    top1: float | None = None  # for log_probs: agreement of the arg-max
    noise: float | None = None  # CPU vs CUDA max abs difference on the same inputs
    ok: bool = True
    detail: str = ""


def environment(providers: list[str]) -> dict:
    """The versions and machine a report was measured with."""
    import platform

    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch

    env = {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": ort.__version__, "numpy": np.__version__,
           "python": platform.python_version(), "machine": f"{platform.machine()} {platform.system()}",
           "providers": providers, "available_providers": ort.get_available_providers()}
    if "cuda" in providers:
        from toolkit.runtimes.onnxruntime.cuda import gpu_environment

        env.update(gpu_environment())
    return env


@dataclass
class Report:
    directory: str
    seed: int
    rows: list[Row] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    environment: dict = field(default_factory=dict)
    reference: str = ""
    reference_kind: str = ""  # checkpoint | random_init | graphs (see toolkit.pytorch.reference.reference_kind)
    reference_proves: str = ""
    weights_sha256: str = ""  # of the graphs' fp32 weights, when computed (--checkpoint, --expect-digest, or a graphs reference)
    runtime: str = DEFAULT_RUNTIME  # the engine that ran the graphs, with its version ("openvino 2026.4.1")
    # The inputs of the first failing comparison (graph, variant, provider, case, feeds), and of one sweep case of
    # the first session to localize on when asked with nothing failing; kept for --localize, not written out.
    failing_inputs: dict | None = None
    probe_inputs: dict | None = None
    localization: dict | None = None  # toolkit.verify.localize.Localization, as JSON
    int8_layers: dict | None = None  # toolkit.verify.int8_layers' table, as JSON, when asked for
    # "variant/provider" -> the largest log-probability error at each decode step, against PyTorch
    step_errors: dict[str, list[float]] = field(default_factory=dict)
    languages: dict | None = None  # a multilingual model's pair verified, in its own codes ({"source": "en", "target": "de"})
    # What could not be checked, through no fault of the graphs, each said in one line (transformers' generate failing
    # on the model, say): the verdict stands on the rows; the command prints these as warnings.
    warnings: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[Row]:
        return [r for r in self.rows if not r.ok]

    def to_json(self) -> dict:
        return {"directory": self.directory, "seed": self.seed, "passed": not self.failures, "runtime": self.runtime,
                "reference": self.reference,
                "reference_kind": self.reference_kind, "reference_proves": self.reference_proves,
                "graph_weights_sha256": self.weights_sha256 or None,
                "skipped_providers": self.skipped, "environment": self.environment,
                "failures": [asdict(r) for r in self.failures], "rows": [asdict(r) for r in self.rows],
                "localization": self.localization, "int8_layers": self.int8_layers, "languages": self.languages,
                "warnings": self.warnings}
