"""The embedded model's long prompt starts, kept: in llama.cpp's slots while the process lives, and on disk after.

An agent CLI sends the same long start with every request (Claude Code: its system prompt and tool listing),
from every machine. llama.cpp keeps each slot's last prompt and reads only what follows the part a new request
shares with it, so a request with a known start goes to a slot that holds that start (``id_slot``). The first
time a start is read, the slot's state is saved into the model cache folder (llama.cpp's slot save), named by a
hash of the model and the start's text; a later process restores it into a slot before the first request with
that start, so a second run reads only each request's own suffix. A start that changes (a new CLI version) gets
a new file; the oldest files beyond ``KEEP`` are removed. The cache only ever saves time: a failed save or
restore is logged and the request is read in full.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import stat
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

log = logging.getLogger(__name__)

#: A start shorter than this (characters) is not worth a file or a pinned slot: it is read again in seconds.
MIN_PREFIX_CHARS = 4000
#: How many saved starts a folder keeps (the most recently used).
KEEP = 4
#: The ending of a saved start's file.
SUFFIX = ".kv"


def private_folder(path: Path) -> Path | None:
    """``path`` made (or kept) as a folder only this user can open, or ``None`` (logged) when it cannot be one.

    A saved start is a slot's state: the prompt it read (an agent CLI's system prompt, a task's words), and what
    a later request with that start answers from. Another local user must not read it, nor put a file of their
    own under a start's name (the name is a hash of the model and a start anyone can know): a folder that is a
    link, or another user's, is not used, and this user's own is made 0700."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            log.warning("prompt starts are not saved: %s is not a folder of this user's", path)
            return None
        if info.st_mode & 0o077:
            os.chmod(path, 0o700)
    except OSError as exc:
        log.warning("prompt starts are not saved: %s: %s", path, exc)
        return None
    return path


def prefix_key(model_sha256: str, text: str) -> str:
    """The name of a start's state: the model's hash and the start's text, hashed (a file name llama.cpp takes)."""
    return hashlib.sha256(f"{model_sha256}\n{text}".encode()).hexdigest()[:40]


class Slots:
    """Which slot serves a request with a known start, and that start's saved state (see the module docstring).

    ``folder`` is the llama.cpp server's ``slot_save_path`` (None: nothing is saved or restored, slots are
    still chosen by start).
    """

    def __init__(self, base_url: str, count: int, folder: Path | None) -> None:
        self._http = httpx.AsyncClient(base_url=base_url, timeout=600)
        self.folder = folder
        self._lock = threading.Lock()
        self._busy: set[int] = set()
        self._holds: list[str | None] = [None] * count
        self._last_use = [0] * count
        self._uses = 0

    def _take(self, key: str) -> int | None:
        with self._lock:
            free = [slot for slot in range(len(self._holds)) if slot not in self._busy]
            if not free:
                return None  # llama.cpp queues the request for the first slot that frees up
            holding = [slot for slot in free if self._holds[slot] == key]
            slot = holding[0] if holding else min(free, key=lambda s: self._last_use[s])
            self._busy.add(slot)
            self._uses += 1
            self._last_use[slot] = self._uses
            return slot

    @contextlib.asynccontextmanager
    async def lease(self, key: str) -> AsyncIterator[int | None]:
        """A slot for one request whose start is ``key``, holding that start if it is known here or on disk
        (None: every slot is busy, and llama.cpp picks one)."""
        slot = self._take(key)
        if slot is None:
            yield None
            return
        try:
            if self._holds[slot] != key:
                self._holds[slot] = None
                if await self._restore(slot, key):
                    self._holds[slot] = key
            try:
                yield slot
            except BaseException:
                self._holds[slot] = None  # a request cut short may have left anything in the slot
                raise
            self._holds[slot] = key
            await self._save(slot, key)
        finally:
            with self._lock:
                self._busy.discard(slot)

    def _file(self, key: str) -> Path | None:
        return None if self.folder is None else self.folder / f"{key}{SUFFIX}"

    async def _restore(self, slot: int, key: str) -> bool:
        path = self._file(key)
        if path is None or not await asyncio.to_thread(path.is_file):
            return False
        started = time.monotonic()
        try:
            answer = await self._http.post(f"/slots/{slot}", params={"action": "restore"},
                                           json={"filename": path.name})
        except httpx.HTTPError as exc:
            log.warning("restoring a saved prompt start into slot %d failed: %s", slot, exc)
            return False
        if answer.status_code != 200:
            log.warning("restoring a saved prompt start into slot %d was refused: %s", slot, answer.text[:300])
            return False
        await asyncio.to_thread(os.utime, path)  # recently used: kept by the pruning
        log.info("restored a prompt start of %s tokens into slot %d in %.1f s",
                 answer.json().get("n_restored"), slot, time.monotonic() - started)
        return True

    async def _save(self, slot: int, key: str) -> None:
        path = self._file(key)
        if path is None or await asyncio.to_thread(path.is_file):
            return
        # saved under a name of its own, then renamed: another process reading the folder sees whole files only
        part = f"{key}.{os.getpid()}-{slot}.part"
        try:
            answer = await self._http.post(f"/slots/{slot}", params={"action": "save"}, json={"filename": part})
        except httpx.HTTPError as exc:
            log.warning("saving the prompt start of slot %d failed: %s", slot, exc)
            return
        if answer.status_code != 200:
            log.warning("saving the prompt start of slot %d was refused: %s", slot, answer.text[:300])
            return
        await asyncio.to_thread(self._keep, path.parent / part, path)
        log.info("saved a prompt start of %s tokens from slot %d", answer.json().get("n_saved"), slot)

    @staticmethod
    def _keep(part: Path, path: Path) -> None:
        os.replace(part, path)
        def used(saved: Path) -> float:
            try:
                return saved.stat().st_mtime
            except OSError:  # removed meanwhile by another process
                return 0.0

        for old in sorted(path.parent.glob(f"*{SUFFIX}"), key=used, reverse=True)[KEEP:]:
            with contextlib.suppress(OSError):
                old.unlink()

    async def aclose(self) -> None:
        """Close the loopback client."""
        await self._http.aclose()
