"""
The one way the scripts run git: in the repo root, output captured, failures as one-line
UsageErrors. Kept kernels are commits, so bench.py (keep/revert), orchestrate.py (switching
kernels) and verify.py (which version is the kept one) all go through here.
"""
import subprocess
from pathlib import Path

from autokernel import ROOT
from autokernel.cli import UsageError, one_line

# A commit made where no identity is configured (a fresh CI box) still goes through.
FALLBACK_IDENTITY = ["-c", "user.name=autokernel", "-c", "user.email=autokernel@localhost"]


def git(*args, check=False, cwd=ROOT, input=None) -> subprocess.CompletedProcess:
    """Run `git args...` in the repo. check=True: a failure raises UsageError (exit 1) naming
    the command and git's last line."""
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, input=input)
    if check and proc.returncode != 0:
        raise UsageError(f"git {' '.join(args[:2])} failed: "
                         f"{one_line(proc.stderr or proc.stdout) or 'no output'}", code=1)
    return proc


def out(*args, cwd=ROOT) -> str:
    """stdout of a git command that must succeed, stripped."""
    return git(*args, check=True, cwd=cwd).stdout.strip()


def is_own_repo(root=ROOT) -> bool:
    """True when root is the top of a git work tree (not a folder inside some other repo)."""
    proc = git("rev-parse", "--show-toplevel", cwd=root)
    return proc.returncode == 0 and Path(proc.stdout.strip()).resolve() == Path(root).resolve()


def has_commit(root=ROOT) -> bool:
    return git("rev-parse", "--verify", "-q", "HEAD", cwd=root).returncode == 0


def changed_paths(*paths, cwd=ROOT) -> list:
    """Paths (relative to the repo) that `git status` reports as changed or untracked."""
    status = git("status", "--porcelain", "--untracked-files=all", "--", *paths, cwd=cwd)
    return [line[3:] for line in status.stdout.splitlines() if line.strip()]


def is_tracked(path, cwd=ROOT) -> bool:
    return git("ls-files", "--error-unmatch", "--", str(path), cwd=cwd).returncode == 0


def show(rev, path, cwd=ROOT):
    """A file's text at a revision, or None when it is not there."""
    proc = git("show", f"{rev}:{path}", cwd=cwd)
    return proc.stdout if proc.returncode == 0 else None


def commit_file(path, message, cwd=ROOT):
    """Commit one file alone (nothing else in the index goes with it). Returns the short hash of
    the commit now holding it: HEAD when the file already equals HEAD's version."""
    git("add", "--", str(path), check=True, cwd=cwd)
    if git("diff", "--cached", "--quiet", "HEAD", "--", str(path), cwd=cwd).returncode != 0:
        identity = [] if git("config", "user.email", cwd=cwd).stdout.strip() \
            else FALLBACK_IDENTITY
        git(*identity, "commit", "-q", "--no-verify", "-m", message, "--", str(path),
            check=True, cwd=cwd)
    return out("rev-parse", "--short", "HEAD", cwd=cwd)


def on_branch(commit, cwd=ROOT) -> bool:
    """Whether a commit is HEAD or one of its ancestors."""
    return bool(commit) and git("merge-base", "--is-ancestor", commit, "HEAD",
                                cwd=cwd).returncode == 0


def restore_file(path, rev="HEAD", cwd=ROOT):
    """Put a file back as it is at `rev` (worktree and index)."""
    git("checkout", rev, "--", str(path), check=True, cwd=cwd)
