"""A sandbox that cannot start gives back everything it took, and says why.

Hole closed (sandbox review): the uid, the host directory and the first pipe were taken
before the start's clean-up began, so a server out of file descriptors (the moment starts
fail) lost a uid and a directory, and kept open fds, on every failed start, and the caller
got a bare ``OSError`` instead of a ``SandboxError`` (the python tool's "unavailable").
Real server-side process with a real fd limit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

SCRIPT = r"""
import json, os, resource
from tools.sandbox import SandboxError, SandboxLimits, SandboxWorker
from tools.sandbox.host import HOSTDIRS
from tools.sandbox.uids import UIDS

def fds():
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            found[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the directory listing's own fd, closed by now
            pass
    return found

SandboxWorker.spawn(SandboxLimits()).close_sync()  # the template is up: its socket is open
before = fds()
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
outcomes = []
for room in range(1, 7):  # fds left: the first pipe, the second, a memfd, the template's answer fail
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(before) + room, hard))
    try:
        SandboxWorker.spawn(SandboxLimits()).close_sync()
        outcomes.append("started")
    except SandboxError as exc:
        outcomes.append("SandboxError: " + str(exc))
    except OSError as exc:
        outcomes.append("OSError: " + str(exc))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
after = fds()
print(json.dumps({
    "outcomes": outcomes,
    # new fds (a template lost on the way and closed is not one: the next start makes a new one)
    "fds_left": sorted(f"{fd} {target}" for fd, target in after.items() if before.get(fd) != target),
    "uids_held": UIDS.in_use,
    "dirs_left": sorted(os.listdir(HOSTDIRS.root)) if HOSTDIRS.root else [],
}))
"""


def test_a_start_that_runs_out_of_fds_gives_everything_back_and_says_why() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for outcome in report["outcomes"]:
        assert outcome == "started" or outcome.startswith("SandboxError: "), report
        assert outcome == "started" or "Too many open files" in outcome, report
    assert report["outcomes"][0] != "started", report
    assert (report["fds_left"], report["uids_held"], report["dirs_left"]) == ([], 0, []), report
