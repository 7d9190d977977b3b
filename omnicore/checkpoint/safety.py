"""Loading a checkpoint never runs code from its files.

torch DCP stores two pickles: the ``.metadata`` file (read by ``FileSystemReader.read_metadata``
with a plain ``pickle.load``, torch 2.13 ``torch/distributed/checkpoint/filesystem.py``) and the
non-tensor values inside ``.distcp`` files, such as optimizer ``param_groups`` (read by
``DefaultLoadPlanner.load_bytes`` with ``torch.load(weights_only=False)``, ``default_planner.py``).
:func:`safe_dcp_load_args` replaces both readers:

* :class:`MetadataUnpickler` resolves only the classes a DCP metadata file is made of (the
  dataclasses of ``torch.distributed.checkpoint.metadata``, ``_StorageInfo``, ``torch.Size``,
  torch dtypes and layouts, paths); any other global (``os.system``, ``builtins.eval``, ...) raises
  before it is called.
* :class:`SafeLoadPlanner` reads non-tensor values with ``torch.load(weights_only=True)``.

The RNG state of each rank is JSON (:func:`write_rng_state`, :func:`read_rng_state`); checkpoints
written before it hold ``rng-rank<r>.pt``, which is read with ``weights_only=True``.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import random
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from omnicore.checkpoint.errors import CheckpointError

_METADATA_GLOBALS: dict[str, set[str]] = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # returns one of torch's layouts, by name
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
}
"""``module -> names`` a DCP ``.metadata`` pickle may name (torch 2.13), besides torch dtypes."""


class MetadataUnpickler(pickle.Unpickler):
    """A :class:`pickle.Unpickler` that resolves only the globals of a DCP metadata file.

    Raises:
        pickle.UnpicklingError: the pickle names any other global (the one thing a pickle needs
            to run code); nothing of it has been called then.
    """

    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not part of a DCP metadata file")


class SafeFileSystemReader(FileSystemReader):
    """DCP's file-system reader with ``read_metadata`` through :class:`MetadataUnpickler`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        """The checkpoint's :class:`~torch.distributed.checkpoint.metadata.Metadata`.

        Raises:
            CheckpointError: the file holds anything but DCP metadata, naming the file.
        """
        from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

        path = self._get_metadata_path(kwargs.get("rank"))
        try:
            with self.fs.create_stream(path, "rb") as f:
                metadata = MetadataUnpickler(f).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as e:
            raise CheckpointError(f"{path}: not a valid DCP metadata file, refused without running it ({e})") from e
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path}: holds a {type(metadata).__name__}, not DCP metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, reading non-tensor values with ``weights_only=True``."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        """Store one non-tensor value (an optimizer hyper-parameter, say) into the state dict."""
        from torch.distributed.checkpoint._traverse import set_element

        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def safe_dcp_load_args(folder: str | Path) -> dict[str, Any]:
    """Keyword arguments for ``dcp.load`` that read ``folder`` without unpickling code."""
    return {"storage_reader": SafeFileSystemReader(str(folder)), "planner": SafeLoadPlanner()}


# ---- RNG state as JSON -----------------------------------------------------------------------


def rng_file(folder: Path, rank: int) -> Path:
    """``<folder>/rng-rank<rank>.json``."""
    return folder / f"rng-rank{rank}.json"


def write_rng_state(path: Path) -> None:
    """Write this process's torch CPU and Python ``random`` state as JSON: ``{"torch": base64 of
    the ByteTensor from torch.get_rng_state(), "python": [version, [625 ints], gauss_next]}``."""
    version, internal, gauss = random.getstate()
    blob = base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii")
    path.write_text(json.dumps({"format": 1, "torch": blob, "python": [version, list(internal), gauss]}))


def read_rng_state(path: Path) -> None:
    """Restore the state :func:`write_rng_state` wrote (or a legacy ``rng-rank<r>.pt``, read with
    ``weights_only=True``).

    Raises:
        CheckpointError: the file is not such a state, naming it.
    """
    try:
        if path.suffix == ".pt":
            rng = torch.load(path, weights_only=True)
            torch_state, (version, internal, gauss) = rng["torch"], rng["python"]
        else:
            rng = json.loads(path.read_text())
            torch_state = torch.frombuffer(bytearray(base64.b64decode(rng["torch"], validate=True)), dtype=torch.uint8)
            version, internal, gauss = rng["python"]
        if not (isinstance(version, int) and all(isinstance(i, int) for i in internal) and (gauss is None or isinstance(gauss, float))):
            raise ValueError("python state is not (int, [ints], float|null)")
        torch.set_rng_state(torch_state)
        random.setstate((version, tuple(internal), gauss))
    except (pickle.UnpicklingError, ValueError, TypeError, KeyError, RuntimeError) as e:
        raise CheckpointError(f"{path}: not a valid RNG state file ({type(e).__name__}: {e}); delete it to resume without it") from e


__all__ = [
    "MetadataUnpickler",
    "SafeFileSystemReader",
    "SafeLoadPlanner",
    "read_rng_state",
    "rng_file",
    "safe_dcp_load_args",
    "write_rng_state",
]
