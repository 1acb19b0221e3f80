"""Open a recorded bag without ROS: camera and command topics, messages in time order, clear errors.

rosbag2 cannot be installed here, so bags are read with the ``rosbags`` library, which understands
every layout a user may hand us:

- a rosbag2 directory with its ``metadata.yaml`` (MCAP or SQLite 3 storage, split into several
  files or not, zstd-compressed per message or per file);
- a bare ``.mcap`` or ``.db3`` storage file without its metadata: rosbags 0.11 opens these
  through the storage plugin itself (topics, counts and times come from the file's own index or
  tables). A rosbag2 directory whose ``metadata.yaml`` was lost opens the same way from its single
  storage file. Bare files cannot say that their payloads are zstd-compressed per message (only
  ``metadata.yaml`` does), so such a file reads as undecodable messages: open its directory instead;
- a ROS 1 ``.bag``, whose messages are converted to CDR for publishing (the ROS 1 header's ``seq``
  is dropped, as ROS 2's Header has none).

Message definitions come from the bag where it carries them (every ROS 1 bag, rosbag2 from Iron on,
all MCAP); types a bag does not define are taken from rosbags' built-in ROS 2 Kilted definitions.
Anything wrong with the input (missing path, not a bag, a FIFO, device or socket where a bag's file should
be, truncated or corrupt storage, an empty bag,
an absent, ambiguous or mistyped topic, a record that does not decode) is a BagError naming the
bag, never a raw rosbags, SQLite or struct exception.
"""

from __future__ import annotations

import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from rosbags.highlevel import AnyReader
from rosbags.interfaces import Connection
from rosbags.typesys import Stores, get_typestore
from rosbags.typesys.store import Typestore

IMAGE_MSGTYPES: tuple[str, ...] = ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage")
COMMAND_MSGTYPES: tuple[str, ...] = ("geometry_msgs/msg/Twist", "std_msgs/msg/Float32MultiArray",
                                  "std_msgs/msg/Float64MultiArray", "sensor_msgs/msg/JointState",
                                  "trajectory_msgs/msg/JointTrajectory")
STORAGE_SUFFIXES: tuple[str, ...] = (".mcap", ".db3")
ROS1_SUFFIX = ".bag"
_SPECIAL_FILES: tuple[tuple[Callable[[int], bool], str], ...] = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class BagError(ValueError):
    """A bag that cannot be used as asked; the message names the bag and says what is wrong."""


@dataclass(frozen=True)
class TopicInfo:
    name: str
    msgtype: str
    count: int


@dataclass(frozen=True)
class BagMessage:
    """One recorded message. ``time_ns`` is the bag's receive (log) time, not the header stamp;
    ``msg`` is a rosbags message with ROS field names (``.header.stamp.sec``, ``.encoding``, ``.data``
    as a numpy uint8 array, ``.format`` ...)."""

    topic: str
    msgtype: str
    time_ns: int
    msg: object


class Bag:
    """One opened bag (a context manager; also closed by ``close``).

    ``start_ns`` and ``end_ns`` are the receive times of the first and the last message, so
    ``duration_s`` is 0 for a bag of one message.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._reader = _open_reader(self.path)
        try:
            reader = self._reader
            self.is_ros1 = not reader.is2
            self.topics: dict[str, TopicInfo] = {
                name: TopicInfo(name, info.msgtype or info.connections[0].msgtype, info.msgcount)
                for name, info in sorted(reader.topics.items())}
            if reader.message_count == 0:
                raise BagError(f"{self.path}: the bag is empty (no messages on {len(self.topics)} topics)")
            self.start_ns: int = reader.start_time
            self.end_ns: int = reader.end_time - 1  # rosbags' end time is one past the last message
            self._cdr_types = _ros2_typestore(reader.typestore) if self.is_ros1 else None
        except BaseException:
            reader.close()
            raise

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def message_count(self) -> int:
        return sum(info.count for info in self.topics.values())

    def image_topic(self, requested: str | None = None) -> str:
        """The camera topic: ``requested`` after checking it, else the bag's only image topic."""
        topic = self._pick(requested, IMAGE_MSGTYPES, "image", "--image-topic")
        if topic is None:
            raise BagError(f"{self.path}: no image topic (of type {' or '.join(IMAGE_MSGTYPES)}); "
                           f"the bag has {self._listing(self.topics.values())}")
        return topic

    def command_topic(self, requested: str | None = None, exclude: str | None = None) -> str | None:
        """The recorded command topic: ``requested`` after checking it, else the bag's only one other than
        ``exclude`` (the robot's state: a JointState may be either), or None."""
        return self._pick(requested, COMMAND_MSGTYPES, "command", "--command-topic", exclude)

    def messages(self, topics: Sequence[str]) -> Iterator[BagMessage]:
        """Deserialized messages of ``topics`` in receive-time order."""
        for connection, time_ns, raw in self._records(topics):
            try:
                msg = self._reader.deserialize(raw, connection.msgtype)
            except Exception as exc:  # noqa: BLE001 - see _records
                raise BagError(f"{self.path}: the {connection.msgtype} message on {connection.topic} at "
                               f"{time_ns} ns does not decode ({type(exc).__name__}: {exc})") from exc
            yield BagMessage(connection.topic, connection.msgtype, time_ns, msg)

    def raw_messages(self, topics: Sequence[str]) -> Iterator[tuple[str, str, int, bytes]]:
        """(topic, msgtype, receive time ns, CDR bytes) of ``topics`` in time order, ready to publish."""
        for connection, time_ns, raw in self._records(topics):
            if self._cdr_types is not None:
                try:
                    raw = self._cdr_types.ros1_to_cdr(raw, connection.msgtype)
                except Exception as exc:  # noqa: BLE001 - see _records
                    raise BagError(f"{self.path}: the ROS 1 {connection.msgtype} message on {connection.topic} "
                                   f"at {time_ns} ns does not convert to CDR ({exc})") from exc
            yield connection.topic, connection.msgtype, time_ns, bytes(raw)

    def times(self, topics: Sequence[str]) -> Iterator[tuple[str, int]]:
        """(topic, receive time ns) of every message of ``topics`` in time order; nothing is decoded or
        converted, so a topic of a type no definition is known for still counts."""
        for connection, time_ns, _ in self._records(topics):
            yield connection.topic, time_ns

    def close(self) -> None:
        if self._reader.stack is not None:
            self._reader.close()

    def __enter__(self) -> Bag:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _records(self, topics: Sequence[str]) -> Iterator[tuple[Connection, int, bytes]]:
        wanted = set(topics)
        if absent := sorted(wanted - set(self.topics)):
            raise BagError(f"{self.path}: no topic {', '.join(absent)}; the bag has {self._listing(self.topics.values())}")
        stream = self._reader.messages([c for c in self._reader.connections if c.topic in wanted])
        read = 0
        while True:
            # rosbags reports a corrupt record with whatever its decoder hit (its own errors, apsw,
            # struct, zstd, lz4, IndexError ...). At this boundary each of them means a bad bag.
            try:
                record = next(stream, None)
            except Exception as exc:  # noqa: BLE001
                raise BagError(f"{self.path}: truncated or corrupt storage while reading messages "
                               f"({type(exc).__name__}: {exc})") from exc
            if record is None:
                break
            read += 1
            yield record
        # A damaged record can also make rosbags skip messages silently (MCAP chunks carry no
        # checksum when written by rosbags), so hold the count read against the bag's own index.
        listed = sum(self.topics[topic].count for topic in wanted)
        if read != listed:
            raise BagError(f"{self.path}: truncated or corrupt storage: read {read} messages on "
                           f"{', '.join(sorted(wanted))}, but the bag lists {listed}")

    def _pick(self, requested: str | None, types: tuple[str, ...], kind: str, option: str,
              exclude: str | None = None) -> str | None:
        candidates = [info for info in self.topics.values() if info.msgtype in types and info.name != exclude]
        if requested is not None:
            info = self.topics.get(requested)
            if info is None:
                raise BagError(f"{self.path}: no topic {requested}; its {kind} topics are "
                               f"{self._listing(candidates) if candidates else 'none'}")
            if info.msgtype not in types:
                raise BagError(f"{self.path}: {requested} carries {info.msgtype}, not a {kind} type "
                               f"({', '.join(types)})")
            return requested
        if len(candidates) > 1:
            raise BagError(f"{self.path}: several {kind} topics, choose one with {option}: {self._listing(candidates)}")
        return candidates[0].name if candidates else None

    @staticmethod
    def _listing(infos: Iterable[TopicInfo]) -> str:
        return ", ".join(f"{info.name} ({info.msgtype}, {info.count} messages)" for info in infos) or "no topics"


def _open_reader(path: Path) -> AnyReader:
    """An opened AnyReader for ``path``, or BagError saying why there is none."""
    if not path.exists():
        raise BagError(f"{path}: no such file or directory")
    _refuse_special(path, path)
    if path.is_dir():
        for entry in sorted(path.iterdir()):
            _refuse_special(entry, path)
    target = path
    if path.is_dir() and not (path / "metadata.yaml").is_file():
        storage = sorted(p for p in path.iterdir() if p.suffix in STORAGE_SUFFIXES)
        if len(storage) != 1:
            raise BagError(f"{path}: not a bag: the directory has no metadata.yaml and "
                           f"{len(storage)} storage files ({', '.join(STORAGE_SUFFIXES)}) instead of one")
        target = storage[0]
    elif path.is_file() and path.suffix not in (*STORAGE_SUFFIXES, ROS1_SUFFIX):
        raise BagError(f"{path}: not a bag (expected a rosbag2 directory, or a "
                       f"{', '.join(STORAGE_SUFFIXES)} or ROS 1 {ROS1_SUFFIX} file)")
    fallback = get_typestore(Stores.ROS1_NOETIC if target.suffix == ROS1_SUFFIX else Stores.ROS2_KILTED)
    try:
        reader = AnyReader([target], default_typestore=fallback)
        reader.open()
    except Exception as exc:  # noqa: BLE001 - rosbags, apsw, YAML and struct errors all mean "unreadable"
        raise BagError(f"{path}: cannot read it as a bag: not a bag, or a truncated or corrupt storage file "
                       f"({type(exc).__name__}: {exc})") from exc
    # Types the bag does not define (older rosbag2 SQLite bags define none) decode with the built-ins.
    known = reader.typestore.fielddefs
    if {c.msgtype for c in reader.connections} - set(known):
        reader.typestore.register({name: fields for name, fields in fallback.fielddefs.items() if name not in known})
    return reader


def _refuse_special(path: Path, bag: Path) -> None:
    """BagError when ``path`` (the bag, or a file in its directory) is a FIFO, a device or a socket: reading
    one blocks for a writer that never comes (a FIFO) or reads what no bag holds, so it is refused unopened."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # a dangling link in a bag directory: reading the bag says what is missing, if anything is
    kind = next((name for is_kind, name in _SPECIAL_FILES if is_kind(mode)), None)
    if kind is not None:
        raise BagError(f"{bag}: not a bag: {'it' if path == bag else path} is {kind}")


def _ros2_typestore(bag_types: Typestore) -> Typestore:
    """ROS 2 definitions to convert a ROS 1 bag's messages to CDR with: rosbags converts by the ROS 2
    layout (a Header without ``seq``); types only the bag knows keep the bag's definitions."""
    store = get_typestore(Stores.ROS2_KILTED)
    store.register({name: fields for name, fields in bag_types.fielddefs.items() if name not in store.fielddefs})
    return store
