"""MNIST from local files first, verified by checksum; the network only as a last resort.

Search order (the first that exists wins):

1. ``$PSCLUSTER_DATA`` -- ``roles.train --data PATH`` exports its argument here, so
   the command line beats an inherited environment. An explicit path that does not
   exist is an error, not a reason to look elsewhere: silently training on other
   data than the one asked for is worse than stopping.
2. the Keras cache, ``~/.keras/datasets/mnist.npz``;
3. the copy this repository carries, ``examples/distributed_mnist/data/mnist.npz``;
4. a download from Keras' URL into the Keras cache, only when 1-3 all failed.

Every file is checked against the published SHA-256 before use; a mismatch names the
file. Each host keeps the mixed splits, decompressed, under ``~/.cache/pscluster/`` (see
:func:`mixed`), so a worker's start or restart does not decompress the file again. This
module imports neither TensorFlow nor Keras (Keras only for a download), so it is cheap to
test.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

MNIST_SHA256 = "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1"
MNIST_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz"
ENV_VAR = "PSCLUSTER_DATA"
REPO_COPY = Path(__file__).resolve().parent / "data" / "mnist.npz"
ARRAYS = ("x_train", "y_train", "x_test", "y_test")


class MnistDataError(RuntimeError):
    """No usable MNIST file, or a file that is not the expected one."""


@dataclass(frozen=True)
class MnistSource:
    path: Path
    origin: str  # "PSCLUSTER_DATA", "keras cache", "repository copy", "download"


def candidate_sources(env: Mapping[str, str] | None = None,
                      home: Path | None = None) -> list[MnistSource]:
    """The local places to look, in order."""
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    sources = []
    if env.get(ENV_VAR):
        sources.append(MnistSource(Path(env[ENV_VAR]).expanduser(), ENV_VAR))
    sources.append(MnistSource(home / ".keras" / "datasets" / "mnist.npz", "keras cache"))
    sources.append(MnistSource(REPO_COPY, "repository copy"))
    return sources


def locate_local(env: Mapping[str, str] | None = None,
                 home: Path | None = None) -> MnistSource | None:
    """The first local source that exists, or None.

    Raises:
        MnistDataError: PSCLUSTER_DATA names a file that does not exist.
    """
    for source in candidate_sources(env, home):
        if source.path.is_file():
            return source
        if source.origin == ENV_VAR:
            raise MnistDataError(
                f"{ENV_VAR} (or --data) names {source.path}, which does not exist")
    return None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_npz(path: Path, sha256: str | None = MNIST_SHA256) -> dict[str, np.ndarray]:
    """Reads the four arrays after checking the file's SHA-256 (None skips the check).

    Raises:
        MnistDataError: checksum mismatch or missing arrays, naming the file.
    """
    if sha256 is not None:
        actual = sha256_of(path)
        if actual != sha256:
            raise MnistDataError(
                f"{path}: SHA-256 is {actual}, expected {sha256} (a truncated or "
                f"different file); delete or replace it")
    with np.load(path) as f:
        missing = [k for k in ARRAYS if k not in f.files]
        if missing:
            raise MnistDataError(f"{path}: not an MNIST npz, lacks {missing}")
        return {k: f[k] for k in ARRAYS}


def download(home: Path | None = None) -> MnistSource:
    """Fetches mnist.npz into the Keras cache (Keras verifies the hash too)."""
    import keras

    home = Path.home() if home is None else home
    path = keras.utils.get_file(
        "mnist.npz", origin=MNIST_URL, file_hash=MNIST_SHA256,
        cache_dir=str(home / ".keras"), cache_subdir="datasets")
    return MnistSource(Path(path), "download")


_CACHE: dict[str, dict[str, np.ndarray]] = {}


def load_mnist(env: Mapping[str, str] | None = None, home: Path | None = None,
               allow_download: bool = True) -> dict[str, np.ndarray]:
    """x_train, y_train, x_test, y_test as uint8 arrays, from the first good source.

    Cached per process, since the train and test splits are requested separately.
    """
    source = locate_local(env, home)
    if source is None:
        if not allow_download:
            raise MnistDataError(
                "no local mnist.npz (looked at: "
                + ", ".join(str(s.path) for s in candidate_sources(env, home))
                + ") and downloading is disabled")
        source = download(home)
    key = str(source.path.resolve())
    if key not in _CACHE:
        _CACHE[key] = read_npz(source.path)
    return _CACHE[key]


# The train arrays are not in random order: examples at even and odd positions differ
# in difficulty (a model trained on all of them scored loss 0.14 on the even half and
# 0.06 on the odd half), so Dataset.shard(2, i) would hand one worker the hard
# digits. A fixed permutation first makes every shard a fair sample, and the same
# one on every worker and in every run (resumed runs continue on the same shards).
PERMUTATION_SEED = 20240611


def mixed_split(split: str) -> tuple[np.ndarray, np.ndarray]:
    """(images, labels) of ``split`` in a fixed random order; cached per process."""
    key = f"mixed_{split}"
    if key not in _CACHE:
        _CACHE[key] = mixed(split)
    return _CACHE[key]["x"], _CACHE[key]["y"]


def mixed(split: str, env: Mapping[str, str] | None = None,
          home: Path | None = None) -> dict[str, np.ndarray]:
    """``split`` mixed, from this host's kept copy when the source is the published file.

    Why a kept copy: mnist.npz is compressed, and decompressing it took 0.23-0.42 s of every
    training process's start on a 2-core host (a sync resize restarts every worker); reading
    the kept, mixed .npy files takes a few milliseconds. The source is still located and its
    SHA-256 checked every time (8 ms); the copy is named after that checksum and the
    permutation, and anything wrong with it (missing, truncated, another SHA-256 than the
    one kept beside it, a folder others can write) means decompressing again and keeping a
    new one.
    """
    source = locate_local(env, home)
    folder = kept_folder(env, home)
    if source is not None and _published(source.path):
        kept = read_kept(folder, split)
        if kept is not None:
            return kept
    arrays = load_mnist(env, home)
    x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
    order = np.random.default_rng(PERMUTATION_SEED).permutation(len(x))
    out = {"x": x[order], "y": y[order]}
    keep(folder, split, out)
    return out


_PUBLISHED: dict[str, bool] = {}


def _published(path: Path) -> bool:
    """Whether ``path`` is the published file: hashed once per process and file (the train
    and test splits both ask)."""
    key = str(path.resolve())
    if key not in _PUBLISHED:
        _PUBLISHED[key] = sha256_of(path) == MNIST_SHA256
    return _PUBLISHED[key]


def kept_folder(env: Mapping[str, str] | None = None, home: Path | None = None) -> Path:
    """Where this host keeps the mixed copies: ``$XDG_CACHE_HOME`` (default ``~/.cache``)
    ``/pscluster/``, one folder per source checksum and permutation."""
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else home / ".cache"
    return base / "pscluster" / f"mnist-{MNIST_SHA256[:16]}-mixed-{PERMUTATION_SEED}"


# The kept copy is trusted only as far as its folders are (issue 42, L4): ``pscluster/`` and the
# copy's folder are made 0700 and must be real folders of this user that nobody else can write;
# each file is written O_EXCL|O_NOFOLLOW (a predictable ``.partial`` name used to follow a planted
# link) and read back only when its SHA-256 matches the one kept beside it (``SPLIT.sha256``,
# written last), not merely its dtype and shape.
_OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _private_folder(folder: Path, *, create: bool) -> bool:
    """Whether ``folder`` (and its parent, ``pscluster/``) is a real folder of this user that
    nobody else can write (made 0700 where ``create``; this user's looser one is tightened)."""
    for each, parents in ((folder.parent, True), (folder, False)):
        if create:
            try:
                each.mkdir(mode=0o700, parents=parents)
            except FileExistsError:
                pass
        try:
            info = os.lstat(each)
        except OSError:
            return False
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            return False
        if stat.S_IMODE(info.st_mode) & 0o077:
            if not create or stat.S_IMODE(info.st_mode) & 0o022:
                return False                  # group/other could have written there: never trusted
            os.chmod(each, 0o700)
    return True


def _read_private(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        return handle.read()


def read_kept(folder: Path, split: str) -> dict[str, np.ndarray] | None:
    """The kept copy of ``split``, or None if it is missing, not what :func:`keep` wrote (its
    SHA-256), or in a folder that is not this user's alone."""
    if not _private_folder(folder, create=False):
        return None
    try:
        digests = json.loads(_read_private(folder / f"{split}.sha256"))
        arrays = {}
        for name in ("x", "y"):
            raw = _read_private(folder / f"{split}-{name}.npy")
            if not isinstance(digests, dict) or hashlib.sha256(raw).hexdigest() != digests.get(name):
                return None
            arrays[name] = np.load(io.BytesIO(raw), allow_pickle=False)
    except (OSError, ValueError):
        return None
    x, y = arrays["x"], arrays["y"]
    if x.dtype != np.uint8 or y.dtype != np.uint8 or x.shape[1:] != (28, 28) or y.shape != x.shape[:1]:
        return None
    return {"x": x, "y": y}


def keep(folder: Path, split: str, arrays: Mapping[str, np.ndarray]) -> None:
    """Writes the copy; best effort (a read-only home, or a folder that is not this user's
    alone, only means decompressing each time). Each file is written under a name of its own
    and renamed into place, so hosts that share a home over NFS, or workers starting
    together, never read a half-written file; the checksums go last."""
    try:
        if not _private_folder(folder, create=True):
            return
        digests = {}
        for name in ("y", "x"):
            buffer = io.BytesIO()
            np.save(buffer, arrays[name], allow_pickle=False)
            digests[name] = hashlib.sha256(buffer.getvalue()).hexdigest()
            _write_new(folder / f"{split}-{name}.npy", buffer.getvalue())
        _write_new(folder / f"{split}.sha256", json.dumps(digests).encode())
    except OSError:
        return


def _write_new(final: Path, data: bytes) -> None:
    partial = final.parent / f".{final.name}.{socket.gethostname()}.{os.getpid()}.{os.urandom(4).hex()}.partial"
    fd = os.open(partial, _OPEN_NEW, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(partial, final)
    finally:
        partial.unlink(missing_ok=True)
