"""Camera frame decoding without ROS: message fields in, an HxWx3 uint8 RGB array out.

The camera subscriber passes the fields of a ``sensor_msgs/Image`` (``encoding, height, width, step,
is_bigendian, data``) or a ``sensor_msgs/CompressedImage`` (``format, data``), so replay, benchmarks
and tests decode frames exactly as the robot does. Every bad input raises ImageDecodeError with a
machine-readable ``reason`` (one of REASONS), so a malformed frame is dropped and counted per reason
on /diagnostics instead of killing the callback.

16-bit rule (mono16, 16UC1 and 16-bit PNG): keep the most significant byte, i.e. ``value >> 8``. It
is a fixed mapping, so the same scene gives the same pixels in every frame; a per-frame min/max
stretch would not, and would make frame signatures flicker. The price is that data using only the
low bits looks dark: 12-bit right-aligned sensors, or 16UC1 depth in millimetres (256 mm per level).
OpenCV's PNG decoder applies the same rule to 16-bit PNG, so raw and compressed frames agree.

The result is always a new C-contiguous array that owns its memory (one copy, made by the colour
conversion itself): the frame outlives its message in the double buffer, and a view would pin the
message buffer and change under the reader if a caller reused a bytearray.
"""

from __future__ import annotations

import array
import re
from typing import Union

import cv2
import numpy as np

MAX_SIDE = 8192
"""Largest accepted height or width. Above any robot camera, and it caps each image buffer a forged
compressed header can make the decoder allocate at 8192 x 8192 x 3 bytes (192 MiB)."""

# Encoding -> (bytes per pixel, OpenCV conversion to RGB; None means the pixels already are RGB).
# 8UC1 and 8UC3 are OpenCV's generic types, which users send straight from cv2: 8UC3 is therefore
# taken as BGR (OpenCV's channel order) and 8UC1 as gray.
_RAW_LAYOUTS: dict[str, tuple[int, int | None]] = {
    "rgb8": (3, None),
    "bgr8": (3, cv2.COLOR_BGR2RGB),
    "rgba8": (4, cv2.COLOR_RGBA2RGB),
    "bgra8": (4, cv2.COLOR_BGRA2RGB),
    "mono8": (1, cv2.COLOR_GRAY2RGB),
    "mono16": (2, cv2.COLOR_GRAY2RGB),
    "16UC1": (2, cv2.COLOR_GRAY2RGB),
    "8UC1": (1, cv2.COLOR_GRAY2RGB),
    "8UC3": (3, cv2.COLOR_BGR2RGB),
}

SUPPORTED_ENCODINGS: tuple[str, ...] = tuple(_RAW_LAYOUTS)
"""Raw ``sensor_msgs/Image`` encodings decode_raw accepts (exact, case-sensitive, as in ROS)."""

# Codec -> the signature its payload must start with. Checking it means only the JPEG and PNG
# decoders ever see network bytes, never whatever other format OpenCV would sniff.
_MAGIC: dict[str, bytes] = {"jpeg": b"\xff\xd8\xff", "png": b"\x89PNG\r\n\x1a\n"}

SUPPORTED_COMPRESSED_FORMATS: tuple[str, ...] = tuple(_MAGIC)
"""Codecs decode_compressed accepts, named anywhere in ``CompressedImage.format``."""

REASONS: frozenset[str] = frozenset(
    {
        "unknown_encoding",  # raw encoding not in SUPPORTED_ENCODINGS
        "bad_dimensions",  # height/width not an integer in 1..MAX_SIDE (raw, or a compressed header)
        "bad_step",  # step not an integer >= width * bytes per pixel
        "bad_endianness",  # is_bigendian not an integer or bool
        "bad_data",  # data not a contiguous bytes-like buffer
        "short_buffer",  # fewer than step * height bytes
        "unsupported_format",  # compressed format names neither jpeg nor png, or is compressedDepth
        "undecodable",  # compressed payload is not a valid image of the named codec
    }
)
"""Every ``ImageDecodeError.reason``, for declaring per-reason drop counters up front."""

Buffer = Union[bytes, bytearray, memoryview, array.array, np.ndarray]
"""What a message's ``data`` arrives as (rclpy gives array.array('B')); any contiguous buffer works."""


class ImageDecodeError(ValueError):
    """A frame that cannot be decoded; ``reason`` (one of REASONS) keys the drop counters."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def decode_raw(
    encoding: str, height: int, width: int, step: int, is_bigendian: int | bool, data: Buffer
) -> np.ndarray:
    """Decode ``sensor_msgs/Image`` fields to an HxWx3 uint8 RGB array.

    Row padding (step above width * bytes per pixel) is skipped by striding; bytes beyond
    step * height are ignored. is_bigendian only matters for the 16-bit encodings.
    """
    layout = _RAW_LAYOUTS.get(encoding) if isinstance(encoding, str) else None
    if layout is None:
        raise ImageDecodeError(
            "unknown_encoding", f"raw encoding {encoding!r} is not one of {', '.join(SUPPORTED_ENCODINGS)}"
        )
    bytes_per_pixel, to_rgb = layout
    height = _integer(height, "bad_dimensions", "height")
    width = _integer(width, "bad_dimensions", "width")
    _check_size(height, width)
    step = _integer(step, "bad_step", "step")
    row_bytes = width * bytes_per_pixel
    if step < row_bytes:
        raise ImageDecodeError(
            "bad_step", f"step {step} is less than width {width} x {bytes_per_pixel} bytes per pixel of {encoding}"
        )
    big_endian = _integer(is_bigendian, "bad_endianness", "is_bigendian") != 0
    buf = np.frombuffer(_byte_view(data), dtype=np.uint8)
    if buf.size < step * height:
        raise ImageDecodeError(
            "short_buffer", f"{buf.size} bytes of data, but {height} rows of step {step} need {step * height}"
        )
    # (height, step) rows -> drop the padding -> (height, width, bytes per pixel); all views, no copy.
    pixels = buf[: step * height].reshape(height, step)[:, :row_bytes].reshape(height, width, bytes_per_pixel)
    if to_rgb is None:
        return pixels.copy()
    if to_rgb == cv2.COLOR_GRAY2RGB:
        # One byte per gray pixel: the only byte, or for 16-bit the most significant one (>> 8).
        most_significant = 0 if bytes_per_pixel == 1 or big_endian else 1
        return cv2.cvtColor(pixels[:, :, most_significant], to_rgb)
    return cv2.cvtColor(pixels, to_rgb)


def decode_compressed(format: str, data: Buffer) -> np.ndarray:
    """Decode ``sensor_msgs/CompressedImage`` fields (JPEG or PNG) to an HxWx3 uint8 RGB array.

    ``format`` may be a bare codec ("jpeg", "png") or image_transport's "rgb8; jpeg compressed bgr8";
    the pixels are RGB whatever encoding it names. Gray becomes three equal channels, alpha is dropped,
    16-bit PNG follows the >> 8 rule, and EXIF orientation is ignored so a frame keeps the geometry
    of its raw twin.
    """
    codec = _codec(format)
    view = _byte_view(data)
    magic = _MAGIC[codec]
    if bytes(view[: len(magic)]) != magic:
        raise ImageDecodeError("undecodable", f"{len(view)}-byte payload does not start like a {codec.upper()}")
    size = _png_size(view) if codec == "png" else _jpeg_size(view)
    if size is None:
        raise ImageDecodeError("undecodable", f"{codec.upper()} header is truncated or malformed")
    _check_size(*size)  # before decoding, so a forged header cannot make OpenCV allocate gigabytes
    try:
        flags = cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION
        bgr = cv2.imdecode(np.frombuffer(view, dtype=np.uint8), flags)
    except cv2.error as exc:
        raise ImageDecodeError("undecodable", f"OpenCV could not decode the {codec.upper()}: {exc}") from exc
    if bgr is None:
        raise ImageDecodeError("undecodable", f"OpenCV could not decode the {codec.upper()} payload")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def frame_from_message(msg: object, compressed: bool, size: tuple[int, int]) -> np.ndarray:
    """An ``Image`` or ``CompressedImage`` (rclpy or rosbags object: same field names) as an HxWx3 frame.

    Frames of another size are resized to ``size`` (height, width) with area averaging, as the camera
    node does before the frame buffer, so live and replayed frames are the same pixels.
    """
    if compressed:
        image = decode_compressed(msg.format, msg.data)
    else:
        image = decode_raw(msg.encoding, msg.height, msg.width, msg.step, msg.is_bigendian, msg.data)
    if image.shape[:2] != tuple(size):
        image = cv2.resize(image, (size[1], size[0]), interpolation=cv2.INTER_AREA)
    return image


def _integer(value: object, reason: str, name: str) -> int:
    """``value`` as a Python int; numpy integers pass, floats and strings do not."""
    if isinstance(value, (int, np.integer)):
        return int(value)
    raise ImageDecodeError(reason, f"{name} must be an integer, not {type(value).__name__}")


def _check_size(height: int, width: int) -> None:
    """Reject empty images and sizes no camera produces (which would only cost memory)."""
    if not (0 < height <= MAX_SIDE and 0 < width <= MAX_SIDE):
        raise ImageDecodeError("bad_dimensions", f"{width}x{height} is outside 1..{MAX_SIDE} pixels per side")


def _byte_view(data: Buffer) -> memoryview:
    """A flat byte view of any contiguous buffer, without copying it."""
    try:
        view = memoryview(data)  # type: ignore[arg-type]
        if view.c_contiguous:
            return view if view.format == "B" and view.ndim == 1 else view.cast("B")
    except (TypeError, ValueError):  # not a buffer, or a released memoryview
        pass
    raise ImageDecodeError(
        "bad_data", f"image data must be a contiguous bytes-like buffer, not {type(data).__name__}"
    )


def _codec(format: str) -> str:
    """The one codec a CompressedImage format names; compressedDepth (a private header) is refused."""
    words = set(re.split(r"[^a-z0-9]+", format.lower())) if isinstance(format, str) else set()
    named = {"jpeg" if word == "jpg" else word for word in words} & set(_MAGIC)
    if len(named) != 1 or "compresseddepth" in words:
        raise ImageDecodeError(
            "unsupported_format", f"compressed format {format!r} does not name exactly one of jpeg, png"
        )
    return named.pop()


def _png_size(view: memoryview) -> tuple[int, int] | None:
    """(height, width) from the IHDR chunk, which PNG requires to come first, once every chunk is
    seen to fit in the payload: a corrupt chunk length can otherwise make OpenCV's reader allocate
    gigabytes for a payload of a few hundred bytes."""
    if len(view) < 33 or bytes(view[12:16]) != b"IHDR":
        return None
    i = 8  # after the signature; each chunk is [length][type][data][crc], IEND included
    while i < len(view):
        end = i + 12 + int.from_bytes(view[i : i + 4], "big")
        if end > len(view):
            return None
        if bytes(view[i + 4 : i + 8]) == b"IEND":
            break
        i = end
    return int.from_bytes(view[20:24], "big"), int.from_bytes(view[16:20], "big")


def _jpeg_size(view: memoryview) -> tuple[int, int] | None:
    """(height, width) from the first start-of-frame marker, walking the segments before the scan."""
    i = 2  # after the start-of-image marker
    while i + 4 <= len(view):
        if view[i] != 0xFF:
            return None
        marker = view[i + 1]
        if marker == 0xFF:  # fill byte before a marker
            i += 1
        elif marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # markers without a length
            i += 2
        elif marker in (0xD9, 0xDA):  # end of image or start of scan before any frame header
            return None
        elif 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # SOFn: [len][precision][H][W]
            if i + 9 > len(view):
                return None
            return int.from_bytes(view[i + 5 : i + 7], "big"), int.from_bytes(view[i + 7 : i + 9], "big")
        else:  # any other segment: skip its length
            i += 2 + int.from_bytes(view[i + 2 : i + 4], "big")
    return None
