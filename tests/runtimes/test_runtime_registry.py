"""The runtime registry (toolkit.runtimes.registry): a new runtime is one package plus one registration, after which
the Python API, `tk translate` and every --runtime choice take it; the deploy path imports only the runtime chosen."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "exported" / "transformer"

# A runtime that is not tk's: its own package, outside toolkit/, whose loader wraps ONNX Runtime's sessions (so its
# translations are ONNX Runtime's by construction) and records what the registry asked it for.
PROBE = '''
from toolkit.runtimes import registry
from toolkit.runtimes.onnxruntime.runtime import RUNTIME as ORT

CALLS = []


def load(m, provider, variant, **options):
    CALLS.append((provider, variant, options["threads"]))
    return ORT.load(m, provider, variant, **options)


RUNTIME = registry.RuntimeSpec(name="probe-rt", runs=registry.GRAPHS, load=load, version=lambda: "0.1",
                               providers=("cpu",), variants=("fp32",), default_threads=lambda provider, variant, m: (1, None))
'''


@pytest.fixture()
def probe_runtime(tmp_path, monkeypatch):
    """The throw-away runtime package on sys.path, and the registry as it was afterwards."""
    from toolkit.runtimes import registry

    package = tmp_path / "tk_probe_rt"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "runtime.py").write_text(PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "TABLE", dict(registry.TABLE))
    monkeypatch.setattr(registry, "_SPECS", dict(registry._SPECS))
    yield "probe-rt"
    for name in [m for m in sys.modules if m.startswith("tk_probe_rt")]:
        del sys.modules[name]


def test_a_new_runtime_is_one_package_and_one_registration(probe_runtime, cli):
    from toolkit import Translator, runtimes

    runtimes.register(probe_runtime, "tk_probe_rt.runtime")  # the one registration
    from tk_probe_rt.runtime import CALLS

    sentences = ["Where is the station?", "I'm home."]
    got = Translator(SHIPPED, runtime=probe_runtime).translate(sentences)
    assert CALLS == [("cpu", "fp32", 1)]  # its own defaults: its provider, its variant, its threads
    assert got == Translator(SHIPPED, provider="cpu", variant="fp32", threads=1).translate(sentences)

    from toolkit.cli import main

    offered = {name: param.type.choices for name, command in main.commands.items() for param in command.params
               if param.name in ("runtime", "runtimes")}
    assert offered and all(probe_runtime in choices for choices in offered.values())
    result = cli("translate", "--model", SHIPPED, "--runtime", probe_runtime, "-q", *sentences)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == got
    assert "probe-rt 0.1" in cli("translate", "--model", SHIPPED, "--runtime", probe_runtime, sentences[0]).output


def test_an_unknown_or_broken_runtime_is_one_line(probe_runtime, cli):
    from toolkit import Translator, runtimes
    from toolkit.core.errors import UsageError

    with pytest.raises(UsageError, match="unknown runtime 'nope'"):
        runtimes.get("nope")
    result = cli("translate", "--model", SHIPPED, "--runtime", "nope", "Hello.")
    assert result.exit_code == 2 and "nope" in result.output
    runtimes.register("broken-rt", "tk_probe_rt.missing")
    with pytest.raises(UsageError, match="registered as tk_probe_rt.missing") as e:
        Translator(SHIPPED, runtime="broken-rt")
    assert "\n" not in str(e.value)


def test_the_deploy_path_imports_only_the_chosen_runtime():
    """Translating on the default runtime imports neither OpenVINO's nor CTranslate2's package (nor torch)."""
    code = textwrap.dedent(f"""
        import sys
        from toolkit import Translator
        Translator({str(SHIPPED)!r}, provider="cpu").translate(["Hello."])
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "openvino", "ctranslate2")
                     or m.startswith(("toolkit.runtimes.openvino", "toolkit.runtimes.ctranslate2"))))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_each_shipped_runtime_declares_what_the_callers_ask():
    """Every caller reads these instead of a runtime's name: each declaration is complete and names itself."""
    from toolkit.runtimes import registry

    for name in registry.names():
        spec = registry.get(name)
        assert spec.name == name and spec.runs in (registry.GRAPHS, registry.CONVERTED)
        assert set(spec.providers) <= {"cpu", "cuda"} and spec.default_variant("cpu") in spec.variants
        assert (spec.verify is None) == (spec.runs == registry.GRAPHS) == (spec.graph_outputs is not None)
    assert registry.names()[0] == registry.DEFAULT
