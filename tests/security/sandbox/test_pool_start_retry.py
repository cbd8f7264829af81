"""A worker killed before it reported ready is started again once, from a fresh fork.

Gap closed (sandbox review, follow-up): a spare SIGKILLed right after the template handed
it its session gave "no reply", and that start was not retried although no session code
had run in it. Killing the spare from outside at exactly that moment is a race (the hand-off
is a message on a socket the spare may have read already), so the seam is the narrowest
real one: ``Template.fork`` is wrapped to call the real fork and then SIGKILL the real
process it returned (through its pidfd); its control channel out is handed /dev/null so
that a ready report written before the kill cannot win the race.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tools.sandbox import SandboxError, SandboxLimits, SandboxWorker
from tools.sandbox.zygote import Template


def _kill_after_fork(monkeypatch: pytest.MonkeyPatch, times: int) -> list[int]:
    killed: list[int] = []
    real = Template.fork

    def fork_then_kill(self: Template, config: dict[str, Any], fds: list[int]) -> Any:
        if len(killed) >= times:
            return real(self, config, fds)
        # Its control channel out leads nowhere: whatever it writes before the kill is lost,
        # so the server sees the "no reply" of a worker that died unready, every time.
        nowhere = os.open("/dev/null", os.O_WRONLY)
        try:
            proc = real(self, config, [fds[0], nowhere, *fds[2:]])
        finally:
            os.close(nowhere)
        killed.append(proc.pid)
        proc.kill()
        return proc

    monkeypatch.setattr(Template, "fork", fork_then_kill)
    return killed


def test_a_worker_killed_before_ready_is_forked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    killed = _kill_after_fork(monkeypatch, times=1)
    worker = SandboxWorker.spawn(SandboxLimits())
    try:
        assert len(killed) == 1 and worker.proc.pid != killed[0]
        assert worker.alive
    finally:
        worker.close_sync()


def test_two_lost_starts_say_no_session_code_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    killed = _kill_after_fork(monkeypatch, times=2)
    with pytest.raises(SandboxError, match="no reply.*tried twice.*no session code had run"):
        SandboxWorker.spawn(SandboxLimits())
    assert len(killed) == 2
