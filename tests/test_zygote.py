"""The zygote (autokernel/zygote.py): on a machine without a GPU a judge forks its kernel
processes from a copy of itself made before it computed anything. Checked in a judge of its own
(a subprocess, as bench.py is): the child answers as a spawned one does, is the zygote's child
and holds no handle on it, its exit code (a signal's too) reaches the judge, and when the judge
dies the zygote and its children die with it. bench.py's runs through it are tests/test_bench.py's
and tests/test_sandbox.py's."""
import json
import os
import subprocess
import sys
import time

import autokernel

JUDGE = """
import json, os, signal, sys, time
import autokernel.kernel_types
from autokernel import judge, zygote

forks = zygote.start()
runner = judge.ChildRunner(sys.argv[1], time.monotonic() + 120, 120)
hello = runner.start(120)
pid = runner.proc.pid

def sockets(p):
    found = set()
    for fd in os.listdir(f"/proc/{p}/fd"):
        try:
            link = os.readlink(f"/proc/{p}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:"):
            found.add(link)
    return found

facts = {"hello": hello["status"], "forked": type(runner.proc).__name__,
         "parent": int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]),
         "zygote": forks.pid, "shared": sorted(sockets(forks.pid) & sockets(pid)),
         "ping": runner.ping().get("status")}
os.kill(pid, signal.SIGSEGV)
runner.proc.join(10)
facts["exitcode"] = runner.proc.exitcode
second = judge.ChildRunner(sys.argv[1], time.monotonic() + 120, 120)
second.start(120)
facts["second"] = second.proc.pid
print(json.dumps(facts), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the judge dies: its zygote and children must too
"""


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_cpu_judge_forks_its_children_from_a_zygote_that_dies_with_it(tmp_path):
    script = tmp_path / "judge.py"
    script.write_text(JUDGE)
    kernel = autokernel.ROOT / "tests" / "planted" / "good_reduce.py"
    env = dict(os.environ, PYTHONPATH=str(autokernel.ROOT),
               AUTOKERNEL_WORKSPACE=str(tmp_path / "workspace"))
    proc = subprocess.run([sys.executable, str(script), str(kernel)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=autokernel.ROOT)
    assert proc.returncode == -9, proc.stderr[-3000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts["hello"] == "loaded" and facts["ping"] == "pong", facts
    assert facts["forked"] == "Forked" and facts["parent"] == facts["zygote"], facts
    assert facts["shared"] == [], facts  # the kernel cannot talk to the zygote
    assert facts["exitcode"] == -11, facts  # SIGSEGV, as multiprocessing reports it
    deadline = time.monotonic() + 10
    while (alive(facts["zygote"]) or alive(facts["second"])) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(facts["zygote"]) and not alive(facts["second"]), facts
