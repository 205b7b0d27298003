"""
The commands the user-facing pages show (BENCHMARKS.md, program.md, README.md) name files that
exist in the repository: a command line in a fenced code block or a backtick span that starts
with `uv run`, `python3` or `bash` (after any VAR=value assignments), and every repo path in it
(a *.py, *.sh or *.md name, or a path under models/, kernels/, benchmarks/, tests/,
autokernel/, docs/). Placeholders and the user's own files are not repo paths: anything with
<, >, *, {, $ or ~ in it, absolute paths, UPPERCASE stand-ins (PROBLEM.py, SOL.py), and paths
under workspace/, dist/ (what the scripts write) or KernelBench/ (a checkout of KernelBench).
Reads text only: no torch, no GPU.
"""
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("BENCHMARKS.md", "program.md", "README.md")
COMMAND = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(?:uv run|python3|bash)\s")
REPO_DIRS = ("models", "kernels", "benchmarks", "tests", "autokernel", "docs")
NOT_REPO_DIRS = ("workspace", "dist", "KernelBench")
PLACEHOLDER = re.compile(r"[<>*{}$~]")


def commands(text):
    """The command lines of a markdown page: fenced code lines (backslash continuations
    joined) and backtick spans, those that start like a command."""
    found, fenced, pending = [], False, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced, pending = not fenced, ""
            continue
        if fenced:
            line = pending + line.strip().removeprefix("$ ")
            pending = line[:-1] + " " if line.endswith("\\") else ""
            if not pending and COMMAND.match(line):
                found.append(line)
        else:
            found += [span.strip() for span in re.findall(r"`([^`\n]+)`", line)
                      if COMMAND.match(span.strip())]
    return found


def words(command):
    try:
        return shlex.split(command, comments=True)
    except ValueError:  # an unbalanced quote in prose: plain words are enough to find paths
        return command.split("#", 1)[0].split()


def repo_paths(command):
    """The repo files and folders a command names."""
    paths = []
    for word in words(command):
        for part in re.split(r"[=,]", word):
            part = part.strip("\"'()[]").rstrip(".;:")
            if not part or PLACEHOLDER.search(part) or part.startswith("/"):
                continue
            head = part.split("/", 1)[0]
            is_file = re.fullmatch(r"[\w./-]+\.(py|sh|md)", part) is not None
            if head in NOT_REPO_DIRS or (is_file and Path(part).stem.isupper()):
                continue
            if is_file or (head in REPO_DIRS and "/" in part):
                paths.append(part)
    return paths


def missing_paths(page, root=ROOT):
    """(path, command) for each repo path a command of the page names that root lacks."""
    return sorted({(path, command) for command in commands((root / page).read_text())
                   for path in repo_paths(command) if not (root / path).exists()})


@pytest.mark.parametrize("page", PAGES)
def test_every_command_on_the_page_names_files_that_exist(page):
    assert missing_paths(page) == []


def test_the_parser_finds_commands_and_their_repo_paths():
    text = ("Run `uv run bench.py -m \"x\"` or\n```bash\nTYPES=a bash benchmarks/none.sh /tmp/o \\\n"
            "   --kernels kernels/softmax.py,kernels/nope.py   # see docs/x.md\n"
            "uv run kernelbench.py setup KernelBench/level1/1_a.py --from SOL.py\n"
            "python3 bench.py --kernel kernels/<type>.py --results workspace/r.tsv\n```\n"
            "`git show 51b5f14:BENCHMARKS.md` is not a command.\n")
    found = commands(text)
    assert [repo_paths(c) for c in found] == [
        ["bench.py"],
        ["benchmarks/none.sh", "kernels/softmax.py", "kernels/nope.py"],
        ["kernelbench.py"],
        ["bench.py"],
    ]


def test_a_journal_driver_outside_the_repository_is_caught(tmp_path):
    (tmp_path / "BENCHMARKS.md").write_text("### A run (`bash .device/e2e.sh llama`)\n")
    assert missing_paths("BENCHMARKS.md", tmp_path) == [
        (".device/e2e.sh", "bash .device/e2e.sh llama")]
