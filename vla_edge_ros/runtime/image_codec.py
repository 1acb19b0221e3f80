"""Camera frame decoding without ROS: message fields in, an HxWx3 uint8 RGB array out.

The camera subscriber passes the fields of a ``sensor_msgs/Image`` (``encoding, height, width, step,
is_bigendian, data``) or a ``sensor_msgs/CompressedImage`` (``format, data``), so replay, benchmarks
and tests decode frames exactly as the robot does. Every bad input raises ImageDecodeError with a
machine-readable ``reason`` (one of REASONS), so a malformed frame is dropped and counted per reason
on /diagnostics instead of killing the callback.

16-bit rule (mono16, 16UC1, bayer_*16 and 16-bit PNG): keep the most significant byte, i.e.
``value >> 8``. It is a fixed mapping, so the same scene gives the same pixels in every frame; a
per-frame min/max stretch would not, and would make frame signatures flicker. The price is that data
using only the low bits looks dark: 12-bit right-aligned sensors, or 16UC1 depth in millimetres (256
mm per level). OpenCV's PNG decoder applies the same rule to 16-bit PNG, so raw and compressed frames
agree. A 16-bit Bayer mosaic is reduced first and then demosaiced as 8-bit: the frame of the 8-bit
mosaic of its high bytes, at a third of the cost of demosaicing 16 bits (0.55 against 1.6 ms at
640x480 here), which would differ by at most one level (on 13 % of the values of a random mosaic).

YUV (yuv422 = uyvy, yuv422_yuy2 = yuyv, nv12, nv21) is converted by OpenCV as BT.601 limited range
(studio swing: Y 16..235 is black to white), the default of USB (UVC) cameras. 4:2:2 shares one
chroma pair between two horizontal pixels, so the width must be even; 4:2:0 (nv12, nv21) also shares
it between two rows, so the height must be even too, and ``height`` counts image rows: ``step`` bytes
per row for ``height`` luma rows, then ``height / 2`` rows of interleaved chroma at the same step.
Bayer mosaics are demosaiced by OpenCV's bilinear interpolation (its default: the cheapest, and
enough for a policy's input resolution); its borders repeat the pixels one in, so a mosaic needs at
least 3 x 3 pixels.

The result is always a new C-contiguous array that owns its memory (one copy, made by the colour
conversion itself): the frame outlives its message in the double buffer, and a view would pin the
message buffer and change under the reader if a caller reused a bytearray.
"""

from __future__ import annotations

import array
import re
from dataclasses import dataclass
from typing import Union

import cv2
import numpy as np

MAX_SIDE = 8192
"""Largest accepted height or width. Above any robot camera, and it caps each image buffer a forged
compressed header can make the decoder allocate at 8192 x 8192 x 3 bytes (192 MiB)."""


@dataclass(frozen=True)
class _Layout:
    """How one raw encoding lies in ``data``, and OpenCV's conversion of it to RGB."""

    bytes_per_pixel: int  # in one row of the image (of the luma plane for 4:2:0)
    to_rgb: int | None  # None: the pixels already are RGB
    sample_bytes: int = 1  # 2: 16-bit samples, reduced to their most significant byte before converting
    subsampling: str = ""  # "4:2:2" (even width) or "4:2:0" (even width and height, a chroma plane after)
    min_side: int = 1  # Bayer: bilinear demosaicing reads a 3 x 3 neighbourhood


# The one table of raw encodings (names as in sensor_msgs/image_encodings). 8UC1 and 8UC3 are
# OpenCV's generic types, which users send straight from cv2: 8UC3 is therefore taken as BGR
# (OpenCV's channel order) and 8UC1 as gray. OpenCV names a Bayer pattern by the second and third
# pixels of its second row, ROS by its top-left 2 x 2 block: ROS's rggb is OpenCV's BG.
_RAW_LAYOUTS: dict[str, _Layout] = {
    "rgb8": _Layout(3, None),
    "bgr8": _Layout(3, cv2.COLOR_BGR2RGB),
    "rgba8": _Layout(4, cv2.COLOR_RGBA2RGB),
    "bgra8": _Layout(4, cv2.COLOR_BGRA2RGB),
    "mono8": _Layout(1, cv2.COLOR_GRAY2RGB),
    "mono16": _Layout(2, cv2.COLOR_GRAY2RGB, sample_bytes=2),
    "16UC1": _Layout(2, cv2.COLOR_GRAY2RGB, sample_bytes=2),
    "8UC1": _Layout(1, cv2.COLOR_GRAY2RGB),
    "8UC3": _Layout(3, cv2.COLOR_BGR2RGB),
    "yuv422": _Layout(2, cv2.COLOR_YUV2RGB_UYVY, subsampling="4:2:2"),  # U Y0 V Y1 (the name before uyvy)
    "uyvy": _Layout(2, cv2.COLOR_YUV2RGB_UYVY, subsampling="4:2:2"),
    "yuv422_yuy2": _Layout(2, cv2.COLOR_YUV2RGB_YUY2, subsampling="4:2:2"),  # Y0 U Y1 V (the name before yuyv)
    "yuyv": _Layout(2, cv2.COLOR_YUV2RGB_YUY2, subsampling="4:2:2"),
    "nv12": _Layout(1, cv2.COLOR_YUV2RGB_NV12, subsampling="4:2:0"),  # Y plane, then U V pairs
    "nv21": _Layout(1, cv2.COLOR_YUV2RGB_NV21, subsampling="4:2:0"),  # Y plane, then V U pairs
    "bayer_rggb8": _Layout(1, cv2.COLOR_BayerBG2RGB, min_side=3),
    "bayer_bggr8": _Layout(1, cv2.COLOR_BayerRG2RGB, min_side=3),
    "bayer_gbrg8": _Layout(1, cv2.COLOR_BayerGR2RGB, min_side=3),
    "bayer_grbg8": _Layout(1, cv2.COLOR_BayerGB2RGB, min_side=3),
    "bayer_rggb16": _Layout(2, cv2.COLOR_BayerBG2RGB, sample_bytes=2, min_side=3),
    "bayer_bggr16": _Layout(2, cv2.COLOR_BayerRG2RGB, sample_bytes=2, min_side=3),
    "bayer_gbrg16": _Layout(2, cv2.COLOR_BayerGR2RGB, sample_bytes=2, min_side=3),
    "bayer_grbg16": _Layout(2, cv2.COLOR_BayerGB2RGB, sample_bytes=2, min_side=3),
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
        "bad_dimensions",  # height/width not an integer in 1..MAX_SIDE (raw, or a compressed header),
        # odd where YUV chroma is shared (width of 4:2:2 and 4:2:0, height of 4:2:0), or a Bayer side under 3
        "bad_step",  # step not an integer >= width * bytes per pixel
        "bad_endianness",  # is_bigendian not an integer or bool
        "bad_data",  # data not a contiguous bytes-like buffer
        "short_buffer",  # fewer than step * rows bytes (rows: height, or height * 3 / 2 for nv12 and nv21)
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

    Row padding (step above width * bytes per pixel) is skipped by striding, in the chroma plane of
    4:2:0 too; bytes beyond the last row are ignored. is_bigendian only matters for the 16-bit
    encodings.
    """
    layout = _RAW_LAYOUTS.get(encoding) if isinstance(encoding, str) else None
    if layout is None:
        raise ImageDecodeError(
            "unknown_encoding", f"raw encoding {encoding!r} is not one of {', '.join(SUPPORTED_ENCODINGS)}"
        )
    height = _integer(height, "bad_dimensions", "height")
    width = _integer(width, "bad_dimensions", "width")
    _check_size(height, width)
    _check_layout_size(encoding, layout, height, width)
    step = _integer(step, "bad_step", "step")
    row_bytes = width * layout.bytes_per_pixel
    if step < row_bytes:
        raise ImageDecodeError(
            "bad_step",
            f"step {step} is less than width {width} x {layout.bytes_per_pixel} bytes per pixel of {encoding}",
        )
    big_endian = _integer(is_bigendian, "bad_endianness", "is_bigendian") != 0
    buf = np.frombuffer(_byte_view(data), dtype=np.uint8)
    rows = height * 3 // 2 if layout.subsampling == "4:2:0" else height  # 4:2:0: luma rows, then chroma rows
    if buf.size < step * rows:
        raise ImageDecodeError(
            "short_buffer", f"{buf.size} bytes of data, but {rows} rows of step {step} need {step * rows}"
        )
    # (rows, step) -> drop the padding -> (rows, width, bytes per pixel); all views, no copy.
    pixels = buf[: step * rows].reshape(rows, step)[:, :row_bytes].reshape(rows, width, layout.bytes_per_pixel)
    if layout.sample_bytes == 2:  # every sample's most significant byte (>> 8): its first byte if big-endian
        pixels = pixels[:, :, (0 if big_endian else 1) :: 2]
    if layout.to_rgb is None:
        return pixels.copy()
    return cv2.cvtColor(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels, layout.to_rgb)


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


def _check_layout_size(encoding: str, layout: _Layout, height: int, width: int) -> None:
    """Reject sizes the encoding cannot have: odd sides where chroma is shared, too small a mosaic."""
    for side, value, shared in (("width", width, bool(layout.subsampling)),
                                ("height", height, layout.subsampling == "4:2:0")):
        if shared and value % 2:
            raise ImageDecodeError(
                "bad_dimensions", f"{encoding} is YUV {layout.subsampling}: its {side} must be even, not {value}"
            )
    if min(height, width) < layout.min_side:
        raise ImageDecodeError(
            "bad_dimensions",
            f"{width}x{height} is too small for {encoding}: demosaicing needs at least "
            f"{layout.min_side} x {layout.min_side} pixels",
        )


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
