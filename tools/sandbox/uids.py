"""Which uids this server's sandbox workers may take, and a claim that no other replica takes them.

As root every worker runs as a uid of its own, drawn from one range. Replicas on one node
share the kernel's uids (containers without user namespaces included): two replicas drawing
from the same range can hand the same uid to two sessions, which could then signal or
ptrace each other and read each other's files. So each replica gets a disjoint slice: an
explicit ``first-last`` range, or slice ``index`` of ``replicas`` equal slices of the range.

A range is also *claimed* on the node: a file in a shared directory (``/run/toolfactory-uids``
by default) holding the range, locked (``flock``) for the life of the process. A replica
whose range overlaps a live claim refuses to start; a claim whose process died is unlocked
and taken over. Replicas that do not share that directory (separate containers without a
shared volume) are kept apart by their configured slices alone.

Within the process, ``UIDS`` hands each worker a uid of the range no other live worker has
(``configure_uids`` sets the range and claims it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import secrets
import threading
import time

from tools.sandbox.records import SandboxError

__all__ = [
    "DEFAULT_CLAIMS_DIR",
    "DEFAULT_UIDS",
    "UIDS",
    "UidAllocator",
    "UidClaim",
    "UidsTaken",
    "claim_free_slice",
    "configure_uids",
    "parse_uid_range",
    "replica_slice",
]

DEFAULT_UIDS = range(200_000, 300_000)
DEFAULT_CLAIMS_DIR = "/run/toolfactory-uids"
_LOWEST = 65_536  # below: system and login users of the host (and of most containers)
_HIGHEST = (1 << 32) - 2  # (uid_t)-1 means "no change" to setresuid


def parse_uid_range(text: str) -> range:
    """``"200000-299999"`` (inclusive) as a range; ValueError naming the problem otherwise."""
    first, sep, last = text.partition("-")
    try:
        if not sep:
            raise ValueError
        uids = range(int(first), int(last) + 1)
    except ValueError:
        raise ValueError(f"sandbox uid range {text!r}: expected FIRST-LAST, e.g. 200000-299999") from None
    return _checked(uids, text)


def replica_slice(uids: range, index: int, replicas: int) -> range:
    """Slice ``index`` (from 0) of ``replicas`` equal, disjoint slices of ``uids``."""
    if replicas < 1 or not 0 <= index < replicas:
        raise ValueError(
            f"sandbox replica index {index} of {replicas} replicas: expected 0 <= index < replicas"
        )
    size = len(uids) // replicas
    if size < 1:
        raise ValueError(f"sandbox uid range {_show(uids)} is too small for {replicas} replicas")
    return _checked(uids[index * size : (index + 1) * size], f"slice {index} of {replicas}")


def _checked(uids: range, what: str) -> range:
    if uids.step != 1 or len(uids) < 1:
        raise ValueError(f"sandbox uid range {what}: empty")
    if uids[0] < _LOWEST or uids[-1] > _HIGHEST:
        raise ValueError(
            f"sandbox uid range {what} ({_show(uids)}): must lie within {_LOWEST}-{_HIGHEST} "
            "(lower uids belong to the host's own users)"
        )
    return uids


def _show(uids: range) -> str:
    return f"{uids[0]}-{uids[-1]}" if len(uids) else "empty"


class UidsTaken(ValueError):
    """The range overlaps the live claim of another server on this node."""


class UidClaim:
    """This process's claim on ``uids`` in ``directory``; ValueError when a live claim overlaps."""

    def __init__(self, uids: range, directory: str = DEFAULT_CLAIMS_DIR) -> None:
        self.uids = uids
        os.makedirs(directory, mode=0o755, exist_ok=True)
        # pids repeat across containers sharing the directory: a random name is this claim's own
        self.path = os.path.join(directory, f"{_show(uids)}-{secrets.token_hex(8)}.claim")
        self._fd = os.open(self.path + ".new", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._stamp = (time.time_ns(), os.path.basename(self.path))
            os.write(self._fd, f"{uids[0]} {uids[-1]} {self._stamp[0]}\n".encode())
            os.rename(self.path + ".new", self.path)  # a visible claim is complete and locked
            # Claims are published before others are read, and of two overlapping live claims
            # the older one (time, then name) stands: of two replicas starting at once exactly
            # one gives way, and a new claim never displaces a running server's.
            for name in sorted(os.listdir(directory)):
                other = os.path.join(directory, name)
                if name.endswith(".claim") and other != self.path:
                    self._check(other)
        except BaseException:
            self.release()
            raise

    def _check(self, path: str) -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # held: a live replica's claim
                first, last, stamp = (int(x) for x in os.pread(fd, 128, 0).split()[:3])
                older = (stamp, os.path.basename(path)) < self._stamp
                if first <= self.uids[-1] and self.uids[0] <= last and older:
                    raise UidsTaken(
                        f"sandbox uid range {_show(self.uids)} overlaps {first}-{last}, claimed by another "
                        f"server on this node ({path}); give each replica its own range "
                        "(sandbox.uid_range, or sandbox.replica_index of sandbox.replicas)"
                    ) from None
                return
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # its process is gone
        finally:
            os.close(fd)

    def release(self) -> None:
        """Give the range up (also done by the kernel when the process ends: the lock goes)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            for path in (self.path, self.path + ".new"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            os.close(fd)


def claim_free_slice(uids: range, replicas: int, directory: str = DEFAULT_CLAIMS_DIR) -> UidClaim:
    """The first of ``replicas`` equal slices of ``uids`` that no live server here has claimed."""
    for index in range(replicas):
        try:
            return UidClaim(replica_slice(uids, index, replicas), directory)
        except UidsTaken:
            continue
    raise ValueError(
        f"all {replicas} sandbox uid slices of {_show(uids)} are claimed by live servers in {directory}; "
        "raise sandbox.replicas (smaller slices) or widen sandbox.uid_range"
    )


class UidAllocator:
    """Hands out distinct sandbox uids within this process, from this replica's range."""

    def __init__(self, uids: range) -> None:
        self._uids = uids
        self._used: set[int] = set()
        self._lock = threading.Lock()
        self._claim: UidClaim | None = None

    @property
    def uids(self) -> range:
        return self._uids

    @property
    def in_use(self) -> int:
        """How many uids live workers hold (or that still have processes left)."""
        return len(self._used)

    def use(self, uids: range, claim: UidClaim | None) -> None:
        """Draw from ``uids`` from now on (held by ``claim``). Workers already running keep
        their uids, which stay taken until they are released."""
        with self._lock:
            old, self._claim, self._uids = self._claim, claim, uids
        if old is not None:
            old.release()

    def acquire(self) -> int:
        """A free uid: random (a uid freed a moment ago is rarely reused at once), else the first free."""
        with self._lock:
            uids = self._uids
            picks = (random.choice(uids) for _ in range(64))
            uid = next((u for u in picks if u not in self._used), None)
            if uid is None:
                uid = next((u for u in uids if u not in self._used), None)
            if uid is None:
                raise SandboxError(f"no free sandbox uid left in {uids[0]}-{uids[-1]}")
            self._used.add(uid)
            return uid

    def release(self, uid: int) -> None:
        with self._lock:
            self._used.discard(uid)


UIDS = UidAllocator(DEFAULT_UIDS)


def configure_uids(uids: range, claims_dir: str | None = None, *, replicas: int | None = None) -> range:
    """This replica's worker uids, a slice no other replica on the node uses (``tools.sandbox.uids``).

    With ``claims_dir`` the range is claimed there for the life of the process (ValueError when
    a live server's claim overlaps it); with ``replicas`` too, the first free one of that many
    slices of ``uids`` is taken. Returns the range in use. A server that is not root hands out
    no uids (its workers keep its own), so it claims nothing.
    """
    if os.geteuid() != 0:
        claims_dir = replicas = None
    if replicas is not None:
        if claims_dir is None:
            raise ValueError("a sandbox uid slice picked automatically needs a claims directory")
        claim = claim_free_slice(uids, replicas, claims_dir)
        uids = claim.uids
    else:
        claim = UidClaim(uids, claims_dir) if claims_dir is not None else None
    UIDS.use(uids, claim)
    return uids
