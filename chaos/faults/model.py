"""What a power loss leaves: a shadow of what each durable step made durable.

The model is the one ALICE and LazyFS use: a file's bytes are durable up to its last
fsync; a name (created, or renamed into place) is durable only after a later fsync of
its directory; a directory made by mkdir is durable once its parent is fsynced. The
rig feeds it the trace of the worker's boundaries and, after the kill, rewrites the
files on disk to one of the states a power loss could leave.

Two refinements: a failed fsync loses the bytes it was to write for good (Linux marks
the dirty pages clean after a writeback error, so a later fsync that succeeds does not
write them: the "fsyncgate" lesson), and the ``names`` variant is a file system that
makes creates and renames durable at once (in order) but file data only at its fsync,
the ordering ext4's data=writeback and most copy-on-write file systems allow.
"""

from __future__ import annotations

import copy
import enum
import os
import shutil
from dataclasses import dataclass, field


class PowerVariant(enum.Enum):
    """What becomes of the bytes written after a file's last fsync."""

    DROP = "drop"  # gone
    PREFIX = "prefix"  # only the first half of them kept
    ZEROS = "zeros"  # the length kept, the bytes zeroed (a metadata-only flush)
    NAMES = "names"  # every name durable as soon as made, data only after its fsync


@dataclass(eq=False)
class FileState:
    """One file (inode): its size, its durable size, and its bytes once they left disk."""

    size: int
    durable: int
    content: bytes | None = None  # known when the rig had to keep it (replaced, or initial)
    # Byte ranges whose only fsync failed: never on disk, whatever a later fsync says.
    lost: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class DurableModel:
    """The volatile and durable namespaces of every directory under ``root``."""

    root: str
    volatile: dict[str, FileState] = field(default_factory=dict)
    durable: dict[str, FileState] = field(default_factory=dict)
    volatile_dirs: set[str] = field(default_factory=set)
    durable_dirs: set[str] = field(default_factory=set)
    # Directories renamed whose new name is not durable yet: new path -> old path.
    moved: dict[str, str] = field(default_factory=dict)

    @classmethod
    def snapshot(cls, root: str) -> DurableModel:
        """Model ``root`` as it is now, everything in it durable (the rig synced it)."""
        model = cls(root)
        for directory, _dirs, files in os.walk(root):
            model.volatile_dirs.add(directory)
            model.durable_dirs.add(directory)
            for name in files:
                path = os.path.join(directory, name)
                with open(path, "rb") as f:
                    data = f.read()
                state = FileState(size=len(data), durable=len(data), content=data)
                model.volatile[path] = state
                model.durable[path] = state
        return model

    # -- the trace ---------------------------------------------------------------------

    def rebased(self, root: str) -> DurableModel:
        """A copy of this model for the same files copied under ``root``."""
        model = copy.deepcopy(self)

        def move(path: str) -> str:
            return root + path[len(self.root) :]

        model.root = root
        model.volatile = {move(p): s for p, s in model.volatile.items()}
        model.durable = {move(p): s for p, s in model.durable.items()}
        model.volatile_dirs = {move(p) for p in model.volatile_dirs}
        model.durable_dirs = {move(p) for p in model.durable_dirs}
        model.moved = {move(new): move(old) for new, old in model.moved.items()}
        return model

    def apply(self, event: dict[str, object]) -> None:
        """Apply one traced step that completed (see chaos.faults.hook for the fields)."""
        step, path = str(event["step"]), str(event["path"])
        if event.get("failed"):
            state = self.volatile.get(path)
            if step == "fsync" and state is not None and state.size > state.durable:
                state.lost.append((state.durable, state.size))  # fsyncgate
            return  # a failed step changed nothing else
        if step == "mkdir":
            self.volatile_dirs.add(path)
        elif step == "create":
            self.volatile[path] = FileState(size=0, durable=0)
        elif step == "write":
            state = self.volatile.get(path)
            if state is not None:
                state.size += int(str(event["n"]))
        elif step == "fsync":
            state = self.volatile.get(path)
            if state is not None:
                state.durable = state.size
        elif step == "truncate":
            state = self.volatile.get(path)
            if state is not None:
                state.size = state.durable = int(str(event["n"]))
                state.lost = [(a, min(b, state.size)) for a, b in state.lost if a < state.size]
        elif step == "rename" and path in self.volatile_dirs:
            self._rename_dir(path, str(event["target"]))
        elif step == "rename":
            target = str(event["target"])
            replaced = self.volatile.get(target)
            old = event.get("old")
            if replaced is not None and isinstance(old, str):
                replaced.content = bytes.fromhex(old)  # the rename unlinks these bytes
            moved = self.volatile.pop(path, None)
            if moved is not None:
                self.volatile[target] = moved
        elif step == "fsync_dir":
            self._sync_dir(path)

    def _rename_dir(self, source: str, target: str) -> None:
        """A directory renamed (a backup's or a restore's copy put in place): everything
        under it goes with it at once; its durable entries follow once the new name is
        durable (``_sync_dir`` of the new parent)."""
        self.volatile = {_moved(p, source, target): s for p, s in self.volatile.items()}
        self.volatile_dirs = {_moved(d, source, target) for d in self.volatile_dirs}
        self.moved[target] = self.moved.pop(source, source)

    def _sync_dir(self, directory: str) -> None:
        for target, source in list(self.moved.items()):
            if os.path.dirname(target) == directory:
                # One directory has one name: once the new one is durable, so is the
                # removal of the old (a journaled rename is one transaction).
                self.durable = {_moved(p, source, target): s for p, s in self.durable.items()}
                self.durable_dirs = {_moved(d, source, target) for d in self.durable_dirs}
                self.durable_dirs.discard(target)  # added below, as any new name
                del self.moved[target]
        for path in [p for p in self.durable if os.path.dirname(p) == directory]:
            del self.durable[path]
        for path, state in self.volatile.items():
            if os.path.dirname(path) == directory:
                self.durable[path] = state
        for sub in self.volatile_dirs:
            if os.path.dirname(sub) == directory:
                self.durable_dirs.add(sub)
        for sub in list(self.durable_dirs):
            if os.path.dirname(sub) == directory and sub not in self.volatile_dirs:
                self.durable_dirs.discard(sub)

    # -- the crash -----------------------------------------------------------------------

    def durable_image(self, variant: PowerVariant) -> tuple[set[str], dict[str, bytes]]:
        """Return the directories and file bytes a power loss would leave."""
        where = {id(state): path for path, state in self.volatile.items()}
        names, directories = self.durable, self.durable_dirs
        if variant is PowerVariant.NAMES:
            names, directories = self.volatile, self.volatile_dirs
        dirs = {d for d in directories if self._reachable(d, directories)}
        files: dict[str, bytes] = {}
        for path, state in names.items():
            if os.path.dirname(path) not in dirs:
                continue
            if state.content is not None and id(state) not in where:
                data = state.content
            else:
                current = where.get(id(state))
                if current is None or not os.path.exists(current):
                    continue
                with open(current, "rb") as f:
                    data = f.read()
            files[path] = _lose(data, state, variant)
        return dirs, files

    def _reachable(self, directory: str, directories: set[str]) -> bool:
        while directory != self.root:
            if directory not in directories:
                return False
            directory = os.path.dirname(directory)
        return True

    def power_loss(self, variant: PowerVariant) -> None:
        """Rewrite the tree under ``root`` to what a power loss would leave."""
        dirs, files = self.durable_image(variant)
        for entry in os.listdir(self.root):
            path = os.path.join(self.root, entry)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        for directory in sorted(dirs, key=len):
            os.makedirs(directory, exist_ok=True)
        for path, data in files.items():
            with open(path, "wb") as f:
                f.write(data)


def _moved(path: str, source: str, target: str) -> str:
    """``path`` once the directory ``source`` is renamed to ``target``."""
    if path == source or path.startswith(source + os.sep):
        return target + path[len(source) :]
    return path


def _lose(data: bytes, state: FileState, variant: PowerVariant) -> bytes:
    kept, unsynced = data[: state.durable], data[state.durable :]
    if variant in (PowerVariant.DROP, PowerVariant.NAMES) or not unsynced:
        image = kept
    elif variant is PowerVariant.PREFIX:
        image = kept + unsynced[: len(unsynced) // 2]
    else:
        image = kept + b"\x00" * len(unsynced)
    for start, stop in state.lost:
        # Blocks whose writeback failed read back as the never-written zeros.
        end = min(stop, len(image))
        if start < end:
            image = image[:start] + b"\x00" * (end - start) + image[end:]
    return image
