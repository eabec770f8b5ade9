"""Local filesystem backend (the embedded default), on aiofiles.

Layout under ``root``::

    objects/<folder>/@<shard>/<name>   the bytes of the published object ``<folder>/<name>``
    meta/<key>.json      its metadata (written and renamed into place before the bytes are)
    tmp/                 objects being written: ``<random>.part`` and ``<random>.meta``
    locks/<n>.lock       lock stripes: every publish and delete of a key holds its stripe's ``flock``
    layout               the version of this layout (absent: every object lies at ``objects/<key>``)

Objects are sharded by the first characters of their name (``files/f_3a9c…`` lies in ``files/@f_3a/``), so one
folder of keys is a few hundred shard directories, none holding more than a slice of the keys, and a page of a
listing reads the shard names and the shards it passes through, not every key of the folder: shards sort in the
order of the keys they hold. ``@`` never starts a key segment, so a shard cannot be mistaken for a folder of keys.
Data directories of the earlier flat layout are migrated at start-up (:meth:`LocalStorage.migrate_layout`), one
hard link and one unlink per object, so an interrupted migration leaves each object under its old name, its new
name or both (the same inode), and the next start finishes it.

Publishing is temp file + fsync + rename (+ fsync of the directory), so a reader sees either nothing or the whole
object with its metadata; a crash leaves only files under ``tmp/``, which :meth:`LocalStorage.start` sweeps.

Small objects are durable at the cost of a few fsyncs each, and fsync latency, not CPU, bounds how many a second
can be stored if each pays its own. So a durable object whose bytes all fit in memory (``small_object``) is
published by a **group commit** (``group_sync``, setting ``TRANSFER_LOCAL_SYNC``): the objects committed while
earlier commits wait on the disk are taken together by one I/O thread (up to ``group_commits`` commits in flight),
which

1. writes every object's temp file and temp metadata (no fsync);
2. makes them durable: ``syncfs`` mode, one ``syncfs(2)`` of the filesystem (every dirty page and inode in it,
   ours included); ``fsync`` mode, an fsync of each temp file and temp metadata, all at once on helper threads
   (concurrent fsyncs share the journal's commits);
3. renames each object into place under its key's lock stripe (compare-and-set as for any publish);
4. makes the renames durable: a second ``syncfs``, or one fsync of each folder they were made in;
5. only then answers every caller of the batch (an error in 2 or 4 fails all of them; a refused rename in 3
   fails only its own).

When a caller hears "stored", its bytes and metadata were on disk before its names were made (2 before 3), and its
names are on disk (4): a power cut after the answer loses nothing, and one before it leaves at worst temp files,
which the start-up sweep removes, or an object published but never acknowledged. ``syncfs`` reports write-back
errors only since Linux 5.8 (and only those after its descriptor was opened, which is before the batch's first
write): elsewhere the ``fsync`` mode is used. ``syncfs`` also flushes other writers' dirty data on the same
filesystem: on a volume shared with busy writers the ``fsync`` mode keeps small objects' latency their own.

Large objects (and ``group_sync="off"``) publish one by one on the storage's own I/O pool (``io_threads``: many
publishes wait on the disk at once), with the bytes' fsync alongside the metadata's and the directory fsyncs of
concurrent publishes shared (:class:`_DirectorySync`: one fsync of a directory covers every rename made in it
before that fsync started).

Several processes may share one data directory, so the sweep must tell a dead writer's temp file from a live one's:
each writer holds an exclusive ``flock`` on its ``.part`` file from creation until it is published or removed (the
kernel drops it when the process dies, kill -9 included), and a sweep deletes only the ``.part`` files it can lock
itself without waiting. A ``<token>.meta`` exists only while its ``<token>.part`` does, so one without its part is
an orphan. Creating and locking a part is not one system call: writers do both under a shared ``flock`` of ``tmp/``
and the sweep holds it exclusively, so it never sees a part created but not yet locked. (``flock`` is per open file
description: this holds between processes on one host and between storages in one process alike; on NFS it needs
working lock support.)

Compare-and-set: each publish writes a new version token into the metadata record (with the inode and mtime of
the bytes it belongs to, so a reader that catches a publish between its two renames notices and reads again).
``create(key, if_match=v)`` compares the current token with ``v`` and publishes while holding the key's lock stripe
(``flock`` on ``locks/<n>.lock``, one of a fixed number, so they never need removing), which every other publish
and delete of that key takes too: the compare and the renames are one step for every process on the host.

The modules, bottom up: ``disk`` (fsyncs, locked temp files, errno translation), ``layout`` (where keys lie, the
lock stripes, the sweep and the migration), ``publish`` (one object renamed into place), ``groupcommit`` (small
objects published together), ``reader`` and ``writer`` (one object's bytes), ``staged`` (objects written at offsets),
``store`` (LocalStorage: the storage protocol and its capabilities).
"""

from storage.local.layout import shard_of
from storage.local.reader import LocalReader
from storage.local.store import LocalStorage
from storage.local.writer import COPY_MIN, LocalWriter

__all__ = ["COPY_MIN", "LocalReader", "LocalStorage", "LocalWriter", "shard_of"]
