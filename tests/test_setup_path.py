"""The one setup path: README's overnight section and program.md's setup give the same commands
in the same order. tests/test_program.py runs them in order in a fresh copy of the repo on a CPU
(each exits 0 without a note, the night's branch exists before the first commit) with the
helpers here: `uv run X.py` runs as `sys.executable X.py` (the same venv: `uv run` in the copy
would build a second one), and profile.py gets a one-op model."""
import os
import re
import subprocess
import sys

import autokernel as ak

REPO = ak.ROOT

MODEL = '''"""One op: a sum over the last dim (the setup-path test's model)."""
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.sum(x, dim=-1)


def get_inputs():
    return [torch.randn(40, 200)]


def get_init_inputs():
    return []
'''


def block_commands(path, heading):
    """The commands of the first ```bash block under `heading`, trailing comments dropped."""
    text = path.read_text()
    section = text[text.index(heading):]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [re.split(r"\s+#\s", line)[0].strip() for line in block.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def readme_commands():
    return block_commands(REPO / "README.md", "## The overnight run")


def test_readme_and_program_md_give_the_same_setup():
    readme = readme_commands()
    assert readme == block_commands(REPO / "program.md", "## 6. Setup")
    assert readme[0].startswith("git checkout -b autokernel/"), "the branch must come first"
    scripts = [c.split()[2] for c in readme if c.startswith("uv run ")]
    assert scripts.index("extract.py") < scripts.index("orchestrate.py") < scripts.index("bench.py")


def git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def fresh_copy(tmp_path):
    """What a clone gives: the working tree's tracked and untracked-but-not-ignored files (no
    workspace/, no results.tsv), committed on main."""
    files = git(REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    for name in filter(None, files.split("\0")):
        src = REPO / name
        if src.is_file() and not name.startswith(("tests/", "scratch/")):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_bytes(src.read_bytes())
    (tmp_path / "tiny_model.py").write_text(MODEL)
    git(tmp_path, "init", "-q", "-b", "main")
    git(tmp_path, "add", "-A")
    git(tmp_path, "-c", "user.name=clone", "-c", "user.email=clone@example.com", "commit", "-q",
        "-m", "clone")
    return tmp_path


def shell(repo, command):
    """Run one documented command as the user would, `uv run` on this venv, CPU mode."""
    line = re.sub(r"^uv run ", f"{sys.executable} ", command)
    if " profile.py" in line:
        line += " --model tiny_model.py"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("AUTOKERNEL_NOW", None)
    proc = subprocess.run(["bash", "-c", line], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=300)
    assert "Traceback" not in proc.stderr, f"{command}:\n{proc.stderr[-3000:]}"
    notes = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("note:")]
    assert not notes, f"{command}: {notes}"
    assert proc.returncode == 0, f"{command}: rc {proc.returncode}\n{proc.stdout[-2000:]}" \
                                 f"{proc.stderr[-2000:]}"
    return dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
