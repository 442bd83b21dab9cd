"""The layout holds what it says: the folders on the deploy side never import torch, the packages import only
downwards (cli on top; core at the bottom), and no module of toolkit imports another that (directly or through
others) imports it back; function-level and type-only imports included."""

from __future__ import annotations

import ast
import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOLKIT = REPO / "toolkit"
# What `tk translate`, `tk serve`, corpus translation, the Python API and the other runtimes load.
TORCH_FREE = ("core", "graphs", "convert", "deploy", "runtimes", "serve", "corpus", "cli")
TORCH_FREE_MODULES = ("toolkit.bench.text",)  # `tk bench --text`: tk's API against CTranslate2, on a deploy-only install
# The packages in layers, lowest first. A module imports from its own package and from the layers below its own,
# never from a package beside it or above it: deploy > runtimes > graphs > core is the deploy path (graphs: the ONNX
# graph tools every runtime shares, none of them a runtime); serve and corpus run it,
# pytorch (the reference, training, export) sits beside them and is never imported by deploy, runtimes or core;
# verify holds the graphs to the PyTorch reference; bench times all of them; cli (with toolkit/__init__.py's
# Translator) is the top.
LAYERS = ({"core"}, {"graphs"}, {"runtimes"}, {"deploy"}, {"corpus", "serve", "pytorch"}, {"verify"}, {"convert"}, {"bench"}, {"cli", "toolkit"})


def module_name(path: Path, root: Path = REPO) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_in(*folders: str) -> list[str]:
    return sorted(module_name(p) for f in folders for p in (TOOLKIT / f).rglob("*.py") if p.name != "__main__.py")


def test_every_module_of_the_torch_free_folders_imports_without_torch():
    names = modules_in(*TORCH_FREE) + list(TORCH_FREE_MODULES)
    assert len(names) > 30 and "toolkit.deploy.translate" in names and "toolkit.runtimes.onnxruntime.loading" in names
    code = ("import importlib, sys\n" + "".join(f"importlib.import_module({n!r})\n" for n in names)
            + "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"


def test_the_top_of_the_package_holds_only_the_entry_points():
    """Each module lives in the folder that says which side it is on."""
    assert sorted(p.name for p in TOOLKIT.glob("*.py")) == ["__init__.py"]
    assert {p.name for p in TOOLKIT.iterdir() if p.is_dir() and p.name != "__pycache__"} == {
        "bench", "cli", "convert", "core", "corpus", "deploy", "graphs", "pytorch", "runtimes", "serve", "verify", "web"}


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    """Module -> the toolkit modules it imports anywhere in its body: at the top, inside functions, and under
    `if TYPE_CHECKING:` (which never runs, but ties the modules together all the same). `from P import x` imports the
    package P (its __init__ runs first) as well as its submodule x: a submodule that names its own package that way
    imports that package's __init__, a circle where the __init__ imports the submodule."""
    paths = {module_name(p, root): p for p in (root / "toolkit").rglob("*.py")}

    def owner(name: str) -> str | None:
        """The module of the tree that `name` is or lies in; None for a name the tree does not hold (toolkit.models:
        the repository's models/ folder, installed under toolkit)."""
        found = name
        while found and found not in paths:
            found = found.rpartition(".")[0]
        return None if not found or (found == "toolkit" and name.count(".") > 1) else found

    graph: dict[str, set[str]] = {m: set() for m in paths}
    for mod, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("toolkit"):
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("toolkit")]
            graph[mod] |= {t for t in map(owner, targets) if t and t != mod}
    return graph


def package(module: str) -> str:
    """toolkit.runtimes.onnxruntime.sessions -> runtimes; toolkit (its __init__) -> toolkit."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    """Every import of a module in a package beside or above the importer's own ('a -> b')."""
    rank = {name: i for i, layer in enumerate(layers) for name in layer}
    # The top module holds the version and lazy entry points only (it imports nothing when imported): what imports it
    # is the circle check's concern, not the layers'.
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if package(a) != package(b) and b != "toolkit" and rank[package(b)] >= rank[package(a)])


def test_every_package_has_its_place_in_the_layers():
    placed = {name for layer in LAYERS for name in layer}
    assert {package(m) for m in import_graph()} == placed


def test_packages_import_only_downwards():
    graph = import_graph()
    assert "toolkit.core.manifest" in graph["toolkit.runtimes.onnxruntime.loading"]  # the graph sees real imports
    assert upward_imports(graph) == []


def runtime_crossings(graph: dict[str, set[str]]) -> list[str]:
    """Every import of one runtime's package (toolkit/runtimes/<name>/) from another's ('a -> b')."""
    def runtime(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 2 and parts[1] == "runtimes" and (TOOLKIT / "runtimes" / parts[2]).is_dir() else None

    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if runtime(a) is not None and runtime(b) is not None and runtime(a) != runtime(b))


def test_no_runtime_imports_another():
    """Each runtime stands on core and graphs (the graph tools they share): OpenVINO once imported the ONNX Runtime
    package for its variants. Planted in the graph, such an import is found."""
    graph = import_graph()
    assert runtime_crossings(graph) == []
    graph["toolkit.runtimes.openvino.engine"] = graph["toolkit.runtimes.openvino.engine"] | {"toolkit.runtimes.onnxruntime.sessions"}
    assert runtime_crossings(graph) == ["toolkit.runtimes.openvino.engine -> toolkit.runtimes.onnxruntime.sessions"]


def test_the_order_check_finds_upward_imports_planted_in_a_copy(tmp_path):
    """A function-level import of the deploy side from core, and a type-only import of the torch side from a runtime,
    each planted in a copy of the tree, are both caught; siblings importing each other are too."""
    copy = tmp_path / "repo"
    shutil.copytree(TOOLKIT, copy / "toolkit", ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "toolkit" / "core" / "errors.py", "a", encoding="utf-8") as f:
        f.write("\n\ndef _planted():\n    from toolkit.deploy.translate import open_model\n\n    return open_model\n")
    with open(copy / "toolkit" / "runtimes" / "openvino" / "engine.py", "a", encoding="utf-8") as f:
        f.write("\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from toolkit.pytorch import registry\n")
    with open(copy / "toolkit" / "serve" / "metrics.py", "a", encoding="utf-8") as f:
        f.write("\n\ndef _planted():\n    import toolkit.corpus.run\n")
    found = sorted(set(upward_imports(import_graph(copy))) - set(upward_imports(import_graph())))
    assert found == ["toolkit.core.errors -> toolkit.deploy.translate", "toolkit.runtimes.openvino.engine -> toolkit.pytorch",
                     "toolkit.runtimes.openvino.engine -> toolkit.pytorch.registry", "toolkit.serve.metrics -> toolkit.corpus.run"]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert cycles(import_graph()) == []


def test_a_submodule_importing_its_own_package_is_a_circle_where_the_package_imports_it(tmp_path):
    """`from toolkit.runtimes.openvino import runtime` in openvino/engine.py runs openvino/__init__.py first: planted in a
    copy where that __init__ imports the engine, the two are a circle (Python meets a half-made package)."""
    copy = tmp_path / "repo"
    shutil.copytree(TOOLKIT, copy / "toolkit", ignore=shutil.ignore_patterns("__pycache__"))
    package = copy / "toolkit" / "runtimes" / "openvino"
    with open(package / "__init__.py", "a", encoding="utf-8") as f:
        f.write("\nfrom toolkit.runtimes.openvino.engine import version\n")
    assert cycles(import_graph(copy)) == []  # the __init__ importing its submodule alone is no circle
    with open(package / "engine.py", "a", encoding="utf-8") as f:
        f.write("\n\ndef _planted():\n    from toolkit.runtimes.openvino import engine\n\n    return engine\n")
    assert cycles(import_graph(copy)) == [["toolkit.runtimes.openvino", "toolkit.runtimes.openvino.engine"]]


def package_graph(root: Path = REPO) -> dict[str, set[str]]:
    """The import graph between (sub)packages: a package's __init__ and its modules are one node
    (toolkit.cli.commands.export -> toolkit.cli.commands; toolkit.cli -> toolkit.cli)."""
    packages = {module_name(p, root) for p in (root / "toolkit").rglob("__init__.py")}
    node = lambda m: m if m in packages else m.rsplit(".", 1)[0]
    graph: dict[str, set[str]] = {}
    for mod, targets in import_graph(root).items():
        graph.setdefault(node(mod), set()).update(node(t) for t in targets if node(t) != node(mod))
    for targets in list(graph.values()):
        for t in targets:
            graph.setdefault(t, set())
    return graph


def test_no_package_circles():
    """A package never imports a package that imports it back: cli's commands do not reach up into cli itself."""
    graph = package_graph()
    assert "toolkit.cli.commands" in graph["toolkit.cli"]
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_planted_circle():
    graph = import_graph()
    graph["toolkit.core.errors"] = graph["toolkit.core.errors"] | {"toolkit.deploy.translate"}
    assert any("toolkit.core.errors" in c and "toolkit.deploy.translate" in c for c in cycles(graph))


def test_a_function_over_60_lines_says_why_beside_it():
    long = []
    for path in TOOLKIT.rglob("*.py"):
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60:
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                above = [line.strip() for line in lines[max(0, first - 4): first - 1]]
                if not any(line.startswith("# Over 60 lines:") for line in above):
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert long == []


def test_no_source_file_is_hidden_from_clones_by_gitignore():
    """An ignore pattern that matches a source file keeps it out of every commit: `build/` once hid
    toolkit/build/__init__.py (now toolkit/pytorch/) and a new module, and only a clean clone showed it."""
    root = Path(__file__).resolve().parents[1]
    sources = [str(p.relative_to(root)) for folder in ("toolkit", "tests", "models") for p in (root / folder).rglob("*.py")
               if "__pycache__" not in p.parts]
    hidden = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], input="\n".join(sources), cwd=root,
                            capture_output=True, text=True).stdout.split()
    assert hidden == []


def runtime_name_uses(source: str, names: tuple[str, ...]) -> list[str]:
    """Each place a runtime is named to act on it: a comparison (==, !=, in, not in) with the name or a collection
    holding it, a parameter's default, the name given to a variable or a class attribute (`RUNTIME = 'ctranslate2'`,
    a dataclass field's default), or the name as an argument of a call (`load(m, 'onnxruntime')`,
    `startswith('ctranslate2')`, a click option's `default=`); as 'line: the code'. A table holding or keyed by the
    name (an architecture's paths, the environment's versions, read with `.get`) acts on no runtime."""
    def named(node, collections: bool = True) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        return collections and isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(named(e) for e in node.elts)

    found = []
    for node in ast.walk(ast.parse(source)):
        hits = []
        if isinstance(node, ast.Compare):
            hits = [node] if any(named(n) for n in (node.left, *node.comparators)) else []
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            hits = [d for d in (*node.args.defaults, *node.args.kw_defaults) if d is not None and named(d)]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            hits = [node.value] if node.value is not None and named(node.value, collections=False) else []
        elif isinstance(node, ast.Call) and not (isinstance(node.func, ast.Attribute) and node.func.attr == "get"):
            hits = [a for a in (*node.args, *(k.value for k in node.keywords)) if named(a, collections=False)]
        found += [f"{n.lineno}: {ast.get_source_segment(source, n)}" for n in hits]
    return found


# The one name outside a runtime's package that is a fact of a file format, not a choice: manifest.json version 2
# recorded ONNX Runtime's verification rows without its name (core reads it below the registry).
FORMAT_FACTS = {("toolkit/core/manifest.py", '"onnxruntime"')}


def test_no_module_outside_a_runtimes_package_names_a_runtime():
    """deploy, serve, corpus, verify, bench and the commands ask the registry (toolkit.runtimes.registry) what a
    runtime runs and how, and take a runtime's name from it or from its package; only the runtime's own package
    (toolkit/runtimes/<name>/) and the registry's one table say the name."""
    from toolkit.runtimes import registry

    names = registry.names()
    assert {"onnxruntime", "openvino", "ctranslate2"} <= set(names)
    own = {TOOLKIT / "runtimes" / name for name in names} | {TOOLKIT / "runtimes" / "registry.py"}
    found = []
    for path in sorted(TOOLKIT.rglob("*.py")):
        if not any(path == o or o in path.parents for o in own):
            where = str(path.relative_to(REPO))
            found += [f"{where}:{use}" for use in runtime_name_uses(path.read_text(encoding="utf-8"), names)
                      if (where, use.split(": ", 1)[1]) not in FORMAT_FACTS]
    assert found == []


def test_the_runtime_name_scan_finds_each_kind_of_use(tmp_path):
    planted = (
        "import click\n"
        "def open_model(runtime='onnxruntime'):\n"
        "    if runtime == 'openvino' or runtime in ('ctranslate2', 'x'):\n"
        "        pass\n"
        "class Job:\n    runtime: str = 'onnxruntime'\n"
        "OPTION = click.option('--runtime', default='onnxruntime')\n"
        "LABEL = 'onnxruntime cpu'\n"  # a row's label, not the name: no use of it
        "RUNTIME = 'ctranslate2'\n"
        "loaded = load(m, 'onnxruntime', 'cpu')\n"
        "ct2 = any(r.startswith('ctranslate2') for r in rows)\n"
        "PATHS = ('export', 'openvino')\n"  # a table of names: no use
        "version = env.get('onnxruntime', '?')\n"  # read from a table by key: no use
    )
    found = runtime_name_uses(planted, ("onnxruntime", "openvino", "ctranslate2"))
    assert [f.split(":")[0] for f in sorted(found, key=lambda f: int(f.split(":")[0]))] == ["2", "3", "3", "6", "7", "9", "10", "11"]
    # Planted in a copy of a deploy module, the whole-tree check fails on it.
    copy = tmp_path / "translate.py"
    copy.write_text((TOOLKIT / "deploy" / "translate.py").read_text(encoding="utf-8") + "\nFALLBACK = 'openvino'\n", encoding="utf-8")
    from toolkit.runtimes import registry

    assert [u.split(": ", 1)[1] for u in runtime_name_uses(copy.read_text(encoding="utf-8"), registry.names())] == ["'openvino'"]


# A writer in one module: it copies the model's manifest into a directory of its own.
PLANTED_WRITER = """
from toolkit.convert import NewDirectory, Writer


def write(m, tmp, echo):
    (tmp / "copied.json").write_bytes((m.directory / "manifest.json").read_bytes())


def verify(m, tmp, written):
    return None if (tmp / "copied.json").read_bytes() == (m.directory / "manifest.json").read_bytes() else "copied.json differs"


WRITER = Writer("copy-manifest", lands=NewDirectory(owned=lambda out, m: {"copied.json"} if (out / "copied.json").exists() else None,
                                                    what="a copied manifest (no copied.json)"), write=write, verify=verify)
"""


def test_a_new_writer_is_one_module_plus_one_registration(tmp_path, monkeypatch):
    """A throw-away writer, one module and one line in the registry's table, writes through the one pipeline with
    every refusal the shipped writers have: a source inside the output, a non-empty output without --force, a
    directory of another kind even with --force, a source that is no model directory."""
    from toolkit.convert import convert, registry
    from toolkit.core.errors import UsageError

    (tmp_path / "planted_writer.py").write_text(PLANTED_WRITER, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.TABLE, "copy-manifest", registry.Entry("planted_writer", help="copies the manifest", takes_dir=True))
    writer = registry.get("copy-manifest")
    source = tmp_path / "outer" / "nw"
    shutil.copytree(REPO / "exported" / "nw", source)

    files = convert(writer, source, tmp_path / "out")
    assert files == {"copied.json": (source / "manifest.json").stat().st_size}
    assert (tmp_path / "out" / "copied.json").read_bytes() == (source / "manifest.json").read_bytes()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's")
    refusals = {
        "holds": (source, tmp_path / "outer", True),  # the source inside the output: replacing it would delete it
        "use --force": (source, tmp_path / "out", False),
        "is not a copied manifest": (source, tmp_path / "mine", True),
        "needs an exported model directory": (tmp_path / "out", tmp_path / "other", False),
    }
    for words, (src, out, force) in refusals.items():
        before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
        try:
            convert(writer, src, out, force)
        except UsageError as e:
            assert words in str(e) and "\n" not in str(e), str(e)
        else:
            raise AssertionError(f"not refused: {words}")
        assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before, words  # nothing written or left
    assert convert(writer, source, tmp_path / "out", force=True) == files


def architecture_homes() -> dict[str, set[Path]]:
    """Each registered architecture's name -> the files that may spell it: its entry module (the one module of
    toolkit/core/entries/ whose text holds the name as a string) and its builder module (the entry's pointer); a name
    that is also a manifest word (a graph kind, a declaration origin) also in the one module declaring that word."""
    from toolkit.core import architectures, declaration

    entries = {p: strings_in(p) for p in (TOOLKIT / "core" / "entries").glob("*.py") if p.name != "__init__.py"}
    homes = {}
    for name, arch in architectures.ARCHITECTURES.items():
        own = [p for p, strings in entries.items() if name in strings]
        assert len(own) == 1, f"{name}: spelled by entry modules {own}"
        homes[name] = {own[0], REPO / (arch.builder.replace(".", "/") + ".py")}
        homes[name] |= {TOOLKIT / "core" / "architectures.py"} if name in architectures.GRAPHS else set()
        homes[name] |= {TOOLKIT / "core" / "declaration.py"} if name in declaration.ORIGINS else set()
        assert all(p.is_file() for p in homes[name]), homes[name]
    return homes


def strings_in(path: Path) -> dict[str, int]:
    """Each string constant of a Python file, with a line it stands on."""
    return {(node.value): node.lineno for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def architecture_names_outside(files, homes: dict[str, set[Path]]) -> list[str]:
    """file:line of each string that is a registered architecture's name, in a file that is none of its homes."""
    return [f"{p.relative_to(next(q for q in p.parents if q.name == 'toolkit').parent)}:{line} {name!r}"
            for p in files for name, line in strings_in(p).items() if name in homes and p not in homes[name]]


def test_an_architecture_is_named_only_by_its_entry_and_its_builder(tmp_path):
    """Each model tk knows is one module of toolkit/core/entries/ (torch-free; found by toolkit.core.architectures at
    import, nothing lists them) plus its builder module (its ModelEntry: config class, build, graphs); the rest of the toolkit
    asks the entries and names no registered architecture as a string, in a comparison, a dict key or a path (the
    shipped model's folder is the entry shipped as the default; bench's shapes name their entry's module).

    Checked that it fails: a line `if m.model == "marian": pass` planted in a copy of toolkit/deploy/pictures.py is
    found (below), and so was each of the places this test was written to remove (tokenizer kinds, CTranslate2's layout
    table, the presets, the shipped folder name)."""
    from toolkit.core import architectures, manifest
    from toolkit.pytorch import registry

    assert {e.name for e in registry.entries()} == set(architectures.ARCHITECTURES)  # every entry's builder has its MODEL
    homes = architecture_homes()
    files = sorted(TOOLKIT.rglob("*.py"))
    assert architecture_names_outside([p for p in files if "node_modules" not in p.parts], homes) == []
    planted = tmp_path / "toolkit" / "deploy" / "pictures.py"
    planted.parent.mkdir(parents=True)
    planted.write_text((TOOLKIT / "deploy" / "pictures.py").read_text(encoding="utf-8") + "\nif m.model == 'marian':\n    pass\n")
    assert [f.split(" ")[1] for f in architecture_names_outside([planted], homes)] == ["'marian'"]

    new = dataclasses.replace(architectures.get("marian"), name="marian_copy", hf_model_types=())
    architectures.register(new)
    try:
        data = {"model": "marian_copy", "kind": "seq2seq", "config": {"decoder_layers": 1}, "graphs": {}}
        assert "graphs ['decoder', 'encoder']" in manifest.schema_problem(data)  # known: its graphs are asked for
    finally:
        del architectures.ARCHITECTURES["marian_copy"]
    assert "unknown model type 'marian_copy'" in manifest.schema_problem(data)


def test_the_tests_mirror_the_package():
    """Each test lives in the folder of the toolkit package it tests (tests/serve/ for toolkit/serve/, ...); only the
    checks of the whole tree (layout, packaging, README, the docs' words, the test command itself) sit at the top of tests/."""
    tests = REPO / "tests"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    packages = {p.name for p in TOOLKIT.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert folders and folders <= packages, folders - packages
    assert sorted(p.name for p in tests.glob("test_*.py")) == ["test_architecture.py", "test_docs_language.py", "test_packaging.py",
                                                              "test_readme.py", "test_suite_limits.py"]
