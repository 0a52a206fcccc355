"""README.md and every page of docs/ stay true to the tree.

- Every file path they name in backticks exists. A path is read from the repository's root;
  a relative one (`jit/alma.py`, `task.py`) from the directories named by the headings above it
  or earlier on its line, or from the package `streammargin/` (ARCHITECTURE's shorthand).
- Every `streammargin.*` / `connectors.*` name they give in backticks is a module or an attribute
  that exists, or (the connector's Kafka names, e.g. the default topic `streammargin.metrics`) a
  string the connector's code holds.
- ARCHITECTURE names every module of streammargin/, streammargin/jit/ and connectors/ (its
  packages included).
- The house ARCHITECTURE draws under "Layers" is the one the imports build: no module imports one
  drawn above it. Every module of connectors/ is in a band of its own package (or of connectors/
  itself), and a package's `__init__.py` counts as a module of its band.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ("README.md", "docs/ARCHITECTURE.md", "docs/kafka.md", "docs/models.md",
        "docs/operations.md", "docs/performance.md")
# Package -> the pattern of its modules: connectors/ with its packages (connectors/worker/, ...).
PACKAGES = {"streammargin": "*.py", "streammargin/jit": "*.py", "connectors": "**/*.py"}
EXTENSIONS = (".py", ".md", ".toml", ".txt", ".json", ".cfg", ".yml", ".yaml", ".sh", ".csv", ".c", ".xml")

BACKTICKED = re.compile(r"(?<!`)`([^`]+)`(?!`)")
DOTTED = re.compile(r"^((?:streammargin|connectors)(?:\.[A-Za-z_][\w-]*)*)")


def spans(doc: str):
    """(backticked text, its line up to it, the headings above it) of a markdown file, fenced
    code blocks left out. A span may continue on the next line (its newline reads as a space)."""
    lines = []
    headings: list[tuple[int, str]] = []
    headings_of = []
    fenced = False
    for line in (ROOT / doc).read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
            line = ""
        elif fenced:
            line = ""
        match = re.match(r"^(#+) ", line)
        if match:
            level = len(match.group(1))
            headings = [(lv, text) for lv, text in headings if lv < level] + [(level, line)]
            line = ""
        lines.append(line)
        headings_of.append([text for _, text in headings])
    text = "\n".join(lines)
    for match in BACKTICKED.finditer(text):
        if "\n\n" in match.group(1):
            continue
        line_start = text.rfind("\n", 0, match.start()) + 1
        number = text.count("\n", 0, match.start())
        yield match.group(1).replace("\n", " "), text[line_start : match.start()], headings_of[
            number
        ]


def is_path(token: str) -> bool:
    """A file or directory, or a module's attribute written as `jit/entry.EntryPoint`: a name
    with a file's extension, or with a slash after an entry of the root or of the package
    (not an HTTP path, a ratio, a topic/partition or a format such as `name/3`)."""
    if any(c in token for c in " <>{}()=:,|*\"'") or token.startswith(("-", ".", "~", "/")):
        return False
    if "__pycache__" in token:
        return False
    if "/" in token:
        first = token.split("/", 1)[0]
        return (ROOT / first).exists() or (ROOT / "streammargin" / first).exists()
    return token.endswith(EXTENSIONS) and not DOTTED.match(token)


def module_attribute(token: str) -> tuple[str, str] | None:
    """(`jit/entry.py`, `EntryPoint`) for `jit/entry.EntryPoint`; None for a plain path."""
    last = token.rsplit("/", 1)[-1]
    if "." not in last or token.endswith(EXTENSIONS):
        return None
    stem, attribute = token.rsplit(".", 1)
    return f"{stem}.py", attribute


def resolve(token: str, context: list[pathlib.Path]) -> pathlib.Path | None:
    split = module_attribute(token)
    if split is not None:
        path = resolve(split[0], context)
        if path is None or path.suffix != ".py":
            return None
        dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        return path if hasattr(importlib.import_module(dotted), split[1]) else None
    for base in [ROOT, *context, ROOT / "streammargin"]:
        candidate = base / token
        if candidate.exists():
            return candidate.resolve()
    return None


def context_dirs(texts: list[str]) -> list[pathlib.Path]:
    """The directories of the paths that `texts` (headings, the line so far) name."""
    dirs = []
    for text in texts:
        for token in BACKTICKED.findall(text):
            if is_path(token):
                found = resolve(token, dirs[::-1])  # the nearest first
                if found is not None:
                    dirs.append(found if found.is_dir() else found.parent)
    return dirs


def named_paths(doc: str):
    """(token, resolved path or None) of every backticked path of `doc`."""
    for token, before, headings in spans(doc):
        if is_path(token):
            # the nearest path before it on its line first, then the headings' innermost
            dirs = [*reversed(context_dirs([before])), *reversed(context_dirs(headings))]
            yield token, resolve(token, dirs)


# Dead-letter headers the README names as written by earlier versions only.
FORMER_NAMES = {"streammargin.error.reason"}


def kafka_names() -> set[str]:
    """The names the connector gives to Kafka: its string literals (topics, formats), and its
    dead-letter headers (`task.ERROR_HEADER` + a literal)."""
    from connectors.task import ERROR_HEADER

    strings = set()
    for path in (ROOT / "connectors").glob("**/*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.add(node.value)
    return strings | {ERROR_HEADER + string for string in strings}


def python_name_exists(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_the_docs_name_exists(doc):
    missing = sorted({token for token, path in named_paths(doc) if path is None})
    assert not missing, f"{doc} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_streammargin_and_connectors_name_the_docs_give_exists(doc):
    kafka = kafka_names()
    missing = set()
    for token, _, _ in spans(doc):
        match = DOTTED.match(token)
        if match is None or is_path(token) or token in kafka:
            continue
        dotted = match.group(1)
        names = [dotted]
        alternative = re.match(r"/([A-Za-z_]\w*)\b", token[match.end() :])
        if alternative:  # `streammargin.state.dumps/loads`
            names.append(dotted.rsplit(".", 1)[0] + "." + alternative.group(1))
        for name in names:
            if not python_name_exists(name) and name not in kafka | FORMER_NAMES:
                missing.add(name)
    assert not missing, f"{doc} names what does not exist: {sorted(missing)}"


def modules() -> dict[str, pathlib.Path]:
    """Dotted name -> file of every module of the packages (their __init__ left out)."""
    found = {}
    for package, pattern in PACKAGES.items():
        for path in sorted((ROOT / package).glob(pattern)):
            if path.name != "__init__.py":
                found[".".join(path.relative_to(ROOT).with_suffix("").parts)] = path
    return found


def layered() -> dict[str, pathlib.Path]:
    """`modules()` and the `__init__.py` of each package of connectors/ under the package's name:
    `from connectors.worker import Worker` imports connectors/worker/__init__.py."""
    found = modules()
    for path in sorted((ROOT / "connectors").glob("*/__init__.py")):
        found[".".join(path.parent.relative_to(ROOT).parts)] = path
    return found


LAYERS_HEADING = "## Layers (arrows point down only)"


def layer_lines() -> list[str]:
    """The drawing under "Layers": its indented lines, top to bottom."""
    text = (ROOT / "docs/ARCHITECTURE.md").read_text()
    block = text.split(LAYERS_HEADING, 1)[1].split("\n## ", 1)[0]
    return [line for line in block.splitlines() if line.startswith("    ")]


def drawn_modules() -> list[tuple[str, list[str]]]:
    """(the path drawn at the start of a line, the .py files its description names) per band;
    a description goes on over the lines that start with spaces under it."""
    bands: list[tuple[str, list[str]]] = []
    for line in layer_lines():
        head = line.split()[0]
        if head.startswith(("streammargin/", "connectors/")):
            bands.append((head, re.findall(r"\b[\w/]+\.py\b", line[len(head) + 4 :])))
        elif line.startswith(" " * 8) and head != "|" and bands:
            bands[-1][1].extend(re.findall(r"\b[\w/]+\.py\b", line))
    return bands


def test_architecture_names_every_module():
    named = {path for _, path in named_paths("docs/ARCHITECTURE.md") if path is not None}
    for head, files in drawn_modules():
        for token in [head, *files]:
            if "<" in token:  # streammargin/<model>.py: the algorithm modules
                continue
            home = ROOT / head if head.endswith("/") else (ROOT / head).parent
            path = resolve(token, [home])
            assert path is not None, f"ARCHITECTURE's drawing names {token}, which does not exist"
            named.add(path)
    unnamed = sorted(
        name for name, path in modules().items() if path.resolve() not in named
    )
    assert not unnamed, f"docs/ARCHITECTURE.md does not name these modules: {unnamed}"


def imports(path: pathlib.Path, known: dict[str, pathlib.Path]) -> set[str]:
    """The modules of the packages that `path` imports (anywhere in it)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        found.update(name for name in names if name in known)
    return found


def ranks() -> dict[str, int]:
    """Module -> its band in ARCHITECTURE's drawing (0 at the top). A band drawn as a directory
    holds its modules, its `__init__.py` and those of its packages not drawn (connectors/schemas/,
    a data package); `streammargin/<model>.py` every streammargin module not drawn alone. Every
    module of connectors/ must be in a band."""
    known = layered()
    rank: dict[str, int] = {}
    model_band = None
    drawn_packages: dict[str, int] = {}
    for band, (head, _) in enumerate(drawn_modules()):
        if head == "streammargin/<model>.py":
            model_band = band
        elif head.endswith("/"):
            package = head.rstrip("/").replace("/", ".")
            drawn_packages[package] = band
            for name in known:
                if name.rsplit(".", 1)[0] == package and known[name].name != "__init__.py":
                    rank[name] = band
        else:
            rank[head.removesuffix(".py").replace("/", ".")] = band
    assert model_band is not None, "the drawing has no streammargin/<model>.py band"
    for name, path in known.items():
        if path.name == "__init__.py":
            band = drawn_packages.get(name, drawn_packages.get(name.rsplit(".", 1)[0]))
            if band is not None:
                rank[name] = band
    undrawn = sorted(name for name in known if name.startswith("connectors") and name not in rank)
    assert not undrawn, f"ARCHITECTURE's drawing has no band for {undrawn}"
    for name in known:
        rank.setdefault(name, model_band)
    return rank


def test_the_house_drawn_from_the_imports_has_no_upward_arrow():
    known = layered()
    rank = ranks()
    upward = sorted(
        f"{name} -> {imported}"
        for name, path in known.items()
        for imported in imports(path, known)
        if rank[imported] < rank[name]
    )
    assert not upward, f"imports of a module drawn above the importer: {upward}"


def test_the_layering_architecture_states():
    known = modules()
    for name, path in known.items():
        imported = imports(path, known)
        if name.startswith("streammargin.jit."):
            assert all(m.startswith("streammargin.jit.") for m in imported), name
        if name.startswith("streammargin."):
            assert not any(m.startswith("connectors.") for m in imported), name
    rank = ranks()
    state_imports = imports(known["streammargin.state"], known)
    assert all(rank[m] > rank["streammargin.state"] for m in state_imports), state_imports
