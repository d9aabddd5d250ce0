"""results.json has one reader, `harness.core.results.read_results`: a module that opened the file another way would
skip its checks (the HarnessError that names the file) and its leniency (an unknown status still renders). The scan
below finds such a read in the harness, the benchmarks and the test helpers, and its controls show it would."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READER = ROOT / "harness" / "core" / "results.py"
FILE_NAME = "results.json"
NAME_OF_IT = "RESULTS_FILE"  # harness.core.results' name for it
READS = {"load", "loads", "open", "read_text", "read_bytes"}  # json.load(s), open(), Path.open/read_text/read_bytes


def _names_the_file(node: ast.AST, aliases: set[str]) -> bool:
    """Whether an expression is (or is built from) the results file's path: the literal name, RESULTS_FILE, or a
    variable of its scope assigned from one of those. A message that mentions the file (an f-string's text) is not
    a path, so the text parts of f-strings are left out."""
    if isinstance(node, ast.JoinedStr):
        return any(_names_the_file(value.value, aliases) for value in node.values
                   if isinstance(value, ast.FormattedValue))
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value.endswith(FILE_NAME)
    if isinstance(node, ast.Name):
        return node.id == NAME_OF_IT or node.id in aliases
    if isinstance(node, ast.Attribute) and node.attr == NAME_OF_IT:
        return True
    return any(_names_the_file(child, aliases) for child in ast.iter_child_nodes(node))


def _scopes(tree: ast.Module):
    """The module's own statements and each function's, each without the functions nested in it."""
    functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
    for scope in (tree, *functions):
        body = []
        stack = list(scope.body)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            body.append(node)
            stack.extend(ast.iter_child_nodes(node))
        yield body


def _aliases(nodes: list[ast.AST]) -> set[str]:
    """Variables of a scope that hold the results file's path (`path = folder / "results.json"`), to a fixpoint."""
    found: set[str] = set()
    assigns = [node for node in nodes if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None]
    while True:
        more = {target.id for node in assigns if _names_the_file(node.value, found)
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(target, ast.Name)} - found
        if not more:
            return found
        found |= more


def other_reads(source: str, where: str = "<sample>") -> list[str]:
    """`where:line` of every call in `source` that reads the results file: json.load(s), open(), or a Path's
    open/read_text/read_bytes on its path."""
    found: dict[str, None] = {}  # `json.loads(path.read_text())` is two reads on one line: named once
    for nodes in _scopes(ast.parse(source)):
        aliases = _aliases(nodes)
        for node in nodes:
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            receiver = [func.value] if isinstance(func, ast.Attribute) and name not in {"load", "loads"} else []
            if name in READS and any(_names_the_file(arg, aliases) for arg in [*node.args, *receiver]):
                found[f"{where}:{node.lineno}"] = None
    return list(found)


def _sources() -> list[Path]:
    return sorted([*(ROOT / "harness").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py"),
                   *(ROOT / "tests").glob("*.py")])


def test_only_read_results_reads_results_json():
    sources = [path for path in _sources() if path != READER]
    assert len(sources) > 100  # the scan saw the tree (a wrong ROOT would pass on nothing)
    found = [hit for path in sources for hit in other_reads(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == [], "read results.json through harness.core.results.read_results, not: " + ", ".join(found)


def test_the_one_reader_is_seen_by_the_scan():
    """The reader itself reads the file by its path: the scan must see that read (or it would see none)."""
    assert other_reads(READER.read_text().replace("path = Path(path)", f"path = Path(path) / {NAME_OF_IT}"))


MERGE_BEFORE = '''
def _read(folder):
    path = folder / "results.json"
    payload = json.loads(path.read_text())
    return payload
'''
READS_ELSEWHERE = {
    "merge's own reader, before this one": MERGE_BEFORE,
    "a literal path read at once": 'payload = json.loads((report_dir / "results.json").read_text())',
    "the name, opened": "with open(folder / RESULTS_FILE) as handle:\n    data = json.load(handle)",
    "the name through the module, as bytes": "data = (folder / results.RESULTS_FILE).read_bytes()",
    "a path of a path": 'first = out / "results.json"\nsecond = first\ntext = second.read_text()',
}
READS_THROUGH_THE_READER = {
    "the reader": "header, cases = read_results(folder / RESULTS_FILE)",
    "a message naming the file": 'def f(path):\n    print(f"wrote {path}: results.json")\n    return path.read_text()',
    "another file": 'lines = (folder / "results.partial.jsonl").read_text().splitlines()',
    "the path in another scope": 'path = folder / "results.json"\ndef f(path):\n    return path.read_text()',
}


def test_the_scan_flags_a_read_another_way():
    """The negative control: each way of reading the file by hand is flagged; reading it through the reader, naming
    it in a message, or reading another file is not."""
    assert {name: bool(other_reads(text)) for name, text in READS_ELSEWHERE.items()} == \
        dict.fromkeys(READS_ELSEWHERE, True)
    assert {name: other_reads(text) for name, text in READS_THROUGH_THE_READER.items()} == \
        dict.fromkeys(READS_THROUGH_THE_READER, [])



def test_every_reader_names_the_file_and_what_to_do_there(tmp_path):
    """The one reader's error, with the advice of the command that asked: a page to render, parts to merge, a side
    of `harness ab` (see its log); here for a file that is not a run's results."""
    import pytest

    from harness.core.errors import HarnessError
    from harness.report import render_html
    from harness.run.merge import merge_runs
    from harness.versions.sides import results

    (tmp_path / FILE_NAME).write_text('{"cases": {}}')
    readers = {"run `harness run` first": render_html, "see the run's log beside it": results,
               "merge the folders that `harness run --shard K/N` wrote": lambda folder: merge_runs([folder], tmp_path)}
    for advice, reader in readers.items():
        with pytest.raises(HarnessError) as error:
            reader(tmp_path)
        said = str(error.value)
        assert said.startswith(f"{tmp_path / FILE_NAME} is not a harness results file") and advice in said, said
