"""Freed memory goes back to the OS once the server is idle (tool_server/memory_trim.py)."""

from __future__ import annotations

import platform

import pytest

from tool_server.memory_trim import GROWTH_BYTES, IdleTrimmer, malloc_trim_function, rss_bytes


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_malloc_trim_is_found_on_glibc_and_runs() -> None:
    trim = malloc_trim_function()
    assert trim is not None
    assert trim() in (0, 1)  # 1: memory was released
    assert rss_bytes() > 0


def test_trims_once_idle_after_activity_or_growth() -> None:
    activity, rss, trims = [0], [100 * GROWTH_BYTES], []
    trimmer = IdleTrimmer(1.0, lambda: activity[0], lambda: trims.append(1) or 1, lambda: rss[0])
    assert not trimmer.due()  # first look: nothing to compare with
    activity[0] += 1
    assert not trimmer.due()  # busy since the last look
    assert trimmer.due()  # idle for a whole interval after activity: trim
    trimmer.trimmed()
    assert not trimmer.due()  # idle, nothing new since the trim
    activity[0] += 1  # e.g. expired results swept: memory freed, RSS not grown
    assert not trimmer.due()
    assert trimmer.due()
    trimmer.trimmed()
    rss[0] += 2 * GROWTH_BYTES  # grown with no activity seen (connections, frames)
    assert trimmer.due()


def test_nothing_runs_without_malloc_trim() -> None:
    trimmer = IdleTrimmer(1.0, lambda: 0, None, lambda: 10 * GROWTH_BYTES)
    trimmer.due()
    assert not trimmer.due()
