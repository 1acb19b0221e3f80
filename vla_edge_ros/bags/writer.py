"""Write bags with rosbags: rosbag2 (MCAP or SQLite 3) as a directory or a single storage file, or ROS 1.

The output is built under a hidden temporary name next to ``out`` and renamed into place once it is
complete, so an interrupted or failed run never leaves a half-written bag under the requested name.
A single ``.mcap`` or ``.db3`` file is the rosbag2 directory's storage file without its
metadata.yaml: bags.reader opens it, ``ros2 bag`` needs the directory.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import TracebackType

import numpy as np
from rosbags.interfaces import Connection
from rosbags.rosbag1 import Writer as Writer1
from rosbags.rosbag2 import CompressionFormat, CompressionMode, StoragePlugin
from rosbags.rosbag2 import Writer as Writer2
from rosbags.typesys import Stores, get_typestore

STORAGES: tuple[str, ...] = ("mcap", "sqlite3", "ros1")
COMPRESSIONS: tuple[str, ...] = ("none", "message", "file", "chunk")
"""zstd per message or per storage file (rosbag2 directories), or per chunk (zstd in MCAP, lz4 in ROS 1)."""
_FILE_STORAGES = {".mcap": "mcap", ".db3": "sqlite3", ".bag": "ros1"}


def storage_for(out: Path, storage: str | None) -> str:
    """The storage an output path asks for: its suffix decides for single files, else ``storage`` (default mcap)."""
    implied = _FILE_STORAGES.get(out.suffix)
    if storage is not None and storage not in STORAGES:
        raise ValueError(f"unknown storage {storage!r}; choose one of {', '.join(STORAGES)}")
    if implied and storage and storage != implied:
        raise ValueError(f"--storage {storage} contradicts the suffix of {out}, which makes it {implied}")
    return implied or storage or "mcap"


class BagWriter:
    """A context manager writing one bag; ``types`` are the message classes to build messages from."""

    def __init__(self, out: str | Path, storage: str | None = None, *, compression: str = "none",
                 force: bool = False) -> None:
        self.out = Path(out)
        self.storage = storage_for(self.out, storage)
        self.single_file = self.out.suffix in _FILE_STORAGES
        if compression not in COMPRESSIONS:
            raise ValueError(f"unknown compression {compression!r}; choose one of {', '.join(COMPRESSIONS)}")
        if compression == "chunk" and self.storage == "sqlite3":
            raise ValueError("SQLite 3 storage has no chunks to compress; use message or file compression")
        if compression in ("message", "file") and (self.single_file or self.storage == "ros1"):
            raise ValueError(f"{compression} compression is recorded in a rosbag2 directory's metadata.yaml; "
                             "write a directory (an --out without .mcap/.db3/.bag) to use it")
        if self.out.exists() or self.out.is_symlink():
            if not force:
                raise ValueError(f"{self.out} exists; pass --force to replace it")
            old_bag = (self.out / "metadata.yaml").is_file() if self.out.is_dir() else self.single_file
            if not old_bag:
                raise ValueError(f"refusing to replace {self.out}: it is not a bag")
        self.compression, self.force = compression, force
        self.typestore = get_typestore(Stores.ROS1_NOETIC if self.storage == "ros1" else Stores.ROS2_KILTED)
        self.types = self.typestore.types
        self._staging = self.out.parent / f".{self.out.name}.partial-{os.getpid()}"
        self._writer: Writer1 | Writer2 | None = None

    def __enter__(self) -> BagWriter:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self._staging.mkdir()
        try:
            self._writer = self._open()
        except BaseException:
            shutil.rmtree(self._staging)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self._writer is not None
        try:
            if exc_type is None:
                self._writer.close()
                self._move_into_place()
            else:
                self._writer.abort()
        finally:
            shutil.rmtree(self._staging, ignore_errors=True)

    def add_topic(self, topic: str, msgtype: str) -> Connection:
        assert self._writer is not None
        return self._writer.add_connection(topic, msgtype, typestore=self.typestore)

    def header(self, time_ns: int, frame_id: str, seq: int = 0) -> object:
        """A std_msgs/Header stamped ``time_ns`` (ROS 1's also carries ``seq``)."""
        stamp = self.types["builtin_interfaces/msg/Time"](sec=time_ns // 10**9, nanosec=time_ns % 10**9)
        extra = {"seq": seq} if self.storage == "ros1" else {}
        return self.types["std_msgs/msg/Header"](stamp=stamp, frame_id=frame_id, **extra)

    def image(self, time_ns: int, frame_id: str, pixels: np.ndarray, seq: int = 0) -> object:
        """An HxWx3 uint8 RGB frame as a sensor_msgs/Image rgb8 stamped ``time_ns``."""
        height, width = pixels.shape[:2]
        return self.types["sensor_msgs/msg/Image"](header=self.header(time_ns, frame_id, seq), height=height,
                                                   width=width, encoding="rgb8", is_bigendian=0, step=width * 3,
                                                   data=np.ascontiguousarray(pixels, dtype=np.uint8).reshape(-1))

    def float32_array(self, values: np.ndarray, label: str | None = None) -> object:
        """``values`` as a std_msgs/Float32MultiArray, its one dimension named ``label`` (none: no layout)."""
        types = self.types
        dims = [] if label is None else [types["std_msgs/msg/MultiArrayDimension"](label=label, size=len(values),
                                                                                    stride=len(values))]
        return types["std_msgs/msg/Float32MultiArray"](layout=types["std_msgs/msg/MultiArrayLayout"](
            dim=dims, data_offset=0), data=np.asarray(values, dtype=np.float32))

    def write(self, connection: Connection, time_ns: int, message: object) -> None:
        assert self._writer is not None
        if self.storage == "ros1":
            data = self.typestore.serialize_ros1(message, connection.msgtype)
        else:
            data = self.typestore.serialize_cdr(message, connection.msgtype)
        self._writer.write(connection, time_ns, data)

    def _open(self) -> Writer1 | Writer2:
        # rosbag2 names the storage file after its directory, so the staged bag has the final name.
        name = self.out.stem if self.single_file else self.out.name
        if self.storage == "ros1":
            writer: Writer1 | Writer2 = Writer1(self._staging / self.out.name)
            if self.compression == "chunk":
                writer.set_compression(Writer1.CompressionFormat.LZ4)
        else:
            plugin = StoragePlugin.MCAP if self.storage == "mcap" else StoragePlugin.SQLITE3
            writer = Writer2(self._staging / name, version=Writer2.VERSION_LATEST, storage_plugin=plugin)
            mode = {"none": CompressionMode.NONE, "message": CompressionMode.MESSAGE,
                    "file": CompressionMode.FILE, "chunk": CompressionMode.STORAGE}[self.compression]
            writer.set_compression(mode, CompressionFormat.ZSTD)
        writer.open()
        return writer

    def _move_into_place(self) -> None:
        if self.storage == "ros1":
            built = self._staging / self.out.name
        elif self.single_file:
            built = self._staging / self.out.stem / self.out.name
        else:
            built = self._staging / self.out.name
        if self.force and self.out.is_dir() and not self.out.is_symlink():
            shutil.rmtree(self.out)
        elif self.force and (self.out.exists() or self.out.is_symlink()):
            self.out.unlink()
        built.rename(self.out)
