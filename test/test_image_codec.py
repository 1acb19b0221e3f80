"""Image decoding: every encoding against hand-built bytes and an independent NumPy reference, every
malformed case by reason, and a fuzz."""

from __future__ import annotations

import array
import subprocess
import sys

import cv2
import numpy as np
import pytest

from vla_edge_ros.runtime.image_codec import (
    MAX_SIDE,
    REASONS,
    SUPPORTED_COMPRESSED_FORMATS,
    SUPPORTED_ENCODINGS,
    ImageDecodeError,
    decode_compressed,
    decode_raw,
)

H, W = 5, 7
YUV_H, YUV_W = 6, 8  # chroma is shared by pixel pairs (and by row pairs in 4:2:0): even sides
PAD_BYTE = 0xEE  # row padding and trailing junk; must never show up in a decoded pixel
UYVY = ("yuv422", "uyvy")
YUYV = ("yuv422_yuy2", "yuyv")
YUV420 = ("nv12", "nv21")
BAYER_8 = ("bayer_rggb8", "bayer_bggr8", "bayer_gbrg8", "bayer_grbg8")
BAYER_16 = ("bayer_rggb16", "bayer_bggr16", "bayer_gbrg16", "bayer_grbg16")


# -- independent references -------------------------------------------------------------------------
#
# YUV: BT.601 limited range (studio swing), the matrix OpenCV's YUV conversions use:
#   R = 1.164 (Y - 16) + 1.596 (V - 128)
#   G = 1.164 (Y - 16) - 0.813 (V - 128) - 0.391 (U - 128)
#   B = 1.164 (Y - 16) + 2.018 (U - 128)
# OpenCV evaluates it in fixed point with 20 fractional bits (each coefficient rounded to a multiple
# of 2^-20), rounds half up, takes Y below 16 as 16 and saturates to 0..255. In floating point the
# same formula differs by one level on 47,185 of the 2^24 (Y, U, V) triples (ties that the rounded
# coefficients break the other way); the exhaustive test below shows this version differs on none.
_SHIFT = 20
_CY, _CVR, _CVG, _CUG, _CUB = (round(c * (1 << _SHIFT)) for c in (1.164, 1.596, -0.813, -0.391, 2.018))


def _bt601_rgb(y: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """RGB of full-resolution Y, U and V planes (chroma already repeated over the pixels sharing it)."""
    luma = (np.maximum(y.astype(np.int32) - 16, 0) * _CY) + (1 << (_SHIFT - 1))
    u, v = u.astype(np.int32) - 128, v.astype(np.int32) - 128
    channels = (luma + _CVR * v, luma + _CVG * v + _CUG * u, luma + _CUB * u)
    return np.stack([np.clip(c >> _SHIFT, 0, 255).astype(np.uint8) for c in channels], axis=-1)


def _cfa(pattern: str, height: int, width: int) -> np.ndarray:
    """The colour (0 R, 1 G, 2 B) each pixel of a mosaic samples; ``pattern`` is its top-left 2 x 2 block."""
    block = np.array(["rgb".index(c) for c in pattern]).reshape(2, 2)
    return np.tile(block, (height // 2 + 1, width // 2 + 1))[:height, :width]


def _bilinear_demosaic(mosaic: np.ndarray, pattern: str) -> np.ndarray:
    """Bilinear demosaicing, OpenCV's default: a pixel keeps its own sample, and a colour it lacks is the
    mean, rounded half up, of that colour's samples among its 8 neighbours (green: the 4 edge ones; red
    or blue: the 2 in the row or column that holds it, or the 4 diagonal ones). OpenCV computes this
    for the interior and repeats the pixels one in on the outermost rows and columns."""
    height, width = mosaic.shape
    colour = _cfa(pattern, height, width)
    values, owner = np.pad(mosaic.astype(np.int64), 1), np.pad(colour, 1, constant_values=-1)
    rgb = np.empty((height, width, 3), np.int64)
    for c in range(3):
        total, count = np.zeros((height, width), np.int64), np.zeros((height, width), np.int64)
        for dy, dx in ((dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if dy or dx):
            window = (slice(1 + dy, 1 + dy + height), slice(1 + dx, 1 + dx + width))
            total += np.where(owner[window] == c, values[window], 0)
            count += owner[window] == c
        rgb[:, :, c] = np.where(colour == c, mosaic, (total + count // 2) // np.maximum(count, 1))
    return np.pad(rgb[1:-1, 1:-1], ((1, 1), (1, 1), (0, 0)), mode="edge").astype(np.uint8)


# -- hand-built messages ------------------------------------------------------------------------------


def _rgb(height: int = H, width: int = W, seed: int = 0) -> np.ndarray:
    """Distinct known pixel values (avoiding PAD_BYTE so padding leaks would be caught)."""
    return np.random.default_rng(seed).integers(0, PAD_BYTE, (height, width, 3), dtype=np.uint8)


def _pack(rows: np.ndarray, pad: int) -> bytes:
    """Raw message bytes from a (rows, width, bytes per pixel) uint8 array, with `pad` bytes per row."""
    flat = rows.reshape(rows.shape[0], -1)
    padding = np.full((rows.shape[0], pad), PAD_BYTE, np.uint8)
    return np.concatenate([flat, padding], axis=1).tobytes()


def _sixteen_bit(high: np.ndarray, big_endian: bool) -> np.ndarray:
    """16-bit samples whose high byte is ``high`` and whose low byte is noise the >> 8 rule must discard."""
    values = high.astype(np.uint16) << 8 | np.uint16(0xA5)
    return values.astype(">u2" if big_endian else "<u2").view(np.uint8).reshape(*high.shape, 2)


def _yuv_case(encoding: str) -> tuple[np.ndarray, np.ndarray]:
    """Random Y, U, V planes in the encoding's byte order, and their reference RGB."""
    rng = np.random.default_rng(7)
    y = rng.integers(0, 256, (YUV_H, YUV_W), dtype=np.uint8)
    chroma_rows = YUV_H // 2 if encoding in YUV420 else YUV_H
    u, v = rng.integers(0, 256, (2, chroma_rows, YUV_W // 2), dtype=np.uint8)
    if encoding in YUV420:  # the Y plane, then one row of U V (nv12) or V U (nv21) pairs per two rows
        pairs = np.stack([u, v] if encoding == "nv12" else [v, u], axis=2).reshape(chroma_rows, YUV_W)
        pixels = np.concatenate([y, pairs])[..., None]
        return pixels, _bt601_rgb(y, *(np.repeat(np.repeat(c, 2, 0), 2, 1) for c in (u, v)))
    chroma = np.stack([u, v], axis=2).reshape(YUV_H, YUV_W)  # U of a pixel pair, then its V
    pixels = np.stack([chroma, y] if encoding in UYVY else [y, chroma], axis=2)  # U Y0 V Y1 or Y0 U Y1 V
    return pixels, _bt601_rgb(y, *(np.repeat(c, 2, 1) for c in (u, v)))


def _raw_case(encoding: str, big_endian: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(pixel bytes as rows x width x bytes per pixel, the RGB the decoder must return)."""
    if encoding in UYVY + YUYV + YUV420:
        return _yuv_case(encoding)
    rgb = _rgb()
    if encoding in BAYER_8 + BAYER_16:
        mosaic = rgb[..., 1]
        expected = _bilinear_demosaic(mosaic, encoding[6:10])
        return (_sixteen_bit(mosaic, big_endian), expected) if encoding in BAYER_16 else (mosaic[..., None], expected)
    alpha = np.full((H, W, 1), 77, np.uint8)
    if encoding == "rgb8":
        return rgb, rgb
    if encoding in ("bgr8", "8UC3"):
        return rgb[..., ::-1], rgb
    if encoding == "rgba8":
        return np.concatenate([rgb, alpha], axis=2), rgb
    if encoding == "bgra8":
        return np.concatenate([rgb[..., ::-1], alpha], axis=2), rgb
    gray = rgb[..., 0]
    expected_gray = np.repeat(gray[..., None], 3, axis=2)
    if encoding in ("mono8", "8UC1"):
        return gray[..., None], expected_gray
    assert encoding in ("mono16", "16UC1"), f"no test case for {encoding}"
    return _sixteen_bit(gray, big_endian), expected_gray


def _assert_fresh_rgb(out: np.ndarray, height: int, width: int) -> None:
    assert out.dtype == np.uint8 and out.shape == (height, width, 3)
    assert out.flags.c_contiguous and out.flags.writeable


@pytest.mark.parametrize("pad", [0, 3])
@pytest.mark.parametrize("encoding", SUPPORTED_ENCODINGS)
def test_raw_round_trip_with_and_without_row_padding(encoding, pad):
    pixels, expected = _raw_case(encoding)
    height, width = expected.shape[:2]
    step = width * pixels.shape[2] + pad
    out = decode_raw(encoding, height, width, step, 0, _pack(pixels, pad) + b"trailing junk")
    _assert_fresh_rgb(out, height, width)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("encoding", ["mono16", "16UC1", *BAYER_16])
@pytest.mark.parametrize("big_endian", [False, True, 0, 1])
def test_16_bit_keeps_the_high_byte_in_either_byte_order(encoding, big_endian):
    pixels, expected = _raw_case(encoding, bool(big_endian))
    out = decode_raw(encoding, H, W, W * 2 + 2, big_endian, _pack(pixels, 2))
    np.testing.assert_array_equal(out, expected)


def test_yuv_is_bt601_limited_range_on_every_y_u_v_triple():
    """All 2^24 (Y, U, V) triples in one 8192 x 2048 yuyv frame: pixel i holds Y = i % 256 and the pair
    it belongs to holds U = i >> 16, V = (i >> 8) % 256."""
    i = np.arange(1 << 24, dtype=np.uint32)
    y, u, v = (i & 255).astype(np.uint8), (i >> 16).astype(np.uint8), ((i >> 8) & 255).astype(np.uint8)
    data = np.stack([y, np.where(i % 2 == 0, u, v)], axis=1).tobytes()  # Y0 U Y1 V
    del i
    out = decode_raw("yuyv", 2048, 8192, 8192 * 2, 0, data).reshape(-1, 3)
    for start in range(0, 1 << 24, 1 << 20):  # in slices: the reference's int32 temporaries stay small
        part = slice(start, start + (1 << 20))
        np.testing.assert_array_equal(out[part], _bt601_rgb(y[part], u[part], v[part]))
    black, white = ((128 << 16) | (128 << 8) | luma for luma in (16, 235))  # limited range: 16..235
    assert out[black].tolist() == [0, 0, 0] and out[white].tolist() == [255, 255, 255]


@pytest.mark.parametrize("encoding", BAYER_8 + BAYER_16)
@pytest.mark.parametrize("height, width", [(3, 3), (6, 9), (480, 640)])
def test_bayer_matches_the_bilinear_reference_and_keeps_flat_colours(encoding, height, width):
    pattern, sixteen = encoding[6:10], encoding in BAYER_16
    rng = np.random.default_rng(height)
    mosaic = rng.integers(0, 256, (height, width), dtype=np.uint8)
    pixels = _sixteen_bit(mosaic, False) if sixteen else mosaic[..., None]
    out = decode_raw(encoding, height, width, width * pixels.shape[2], 0, pixels.tobytes())
    np.testing.assert_array_equal(out, _bilinear_demosaic(mosaic, pattern))
    # A flat colour is that colour at every pixel, borders included: no pattern mix-up, no bleeding.
    colour = np.array([200, 90, 30], np.uint8)
    flat = colour[_cfa(pattern, height, width)]
    pixels = _sixteen_bit(flat, True) if sixteen else flat[..., None]
    out = decode_raw(encoding, height, width, width * pixels.shape[2], sixteen, pixels.tobytes())
    assert (out == colour).all()


def test_16_bit_rule_on_known_values():
    values = np.array([[0x0000, 0x00FF, 0x0100, 0x12F0, 0xFFFF]], dtype=">u2")
    out = decode_raw("mono16", 1, 5, 10, 1, values.tobytes())
    assert out[0, :, 0].tolist() == [0x00, 0x00, 0x01, 0x12, 0xFF]


@pytest.mark.parametrize("wrap", [bytes, bytearray, lambda b: array.array("B", b), memoryview,
                                  lambda b: np.frombuffer(b, np.uint8), lambda b: memoryview(b).cast("H")])
def test_every_buffer_type_and_the_result_never_aliases_it(wrap):
    rgb = _rgb()
    data = wrap(rgb.tobytes() + b"trailing junk is fine")
    out = decode_raw("rgb8", H, W, W * 3, 0, data)
    np.testing.assert_array_equal(out, rgb)
    assert out.flags.owndata and not np.shares_memory(out, np.frombuffer(memoryview(data).cast("B"), np.uint8))


def test_numpy_integer_fields_are_accepted():
    rgb = _rgb()
    out = decode_raw("rgb8", np.uint32(H), np.uint32(W), np.uint32(W * 3), np.uint8(0), rgb.tobytes())
    np.testing.assert_array_equal(out, rgb)


def test_largest_side_is_accepted():
    out = decode_raw("mono8", 1, MAX_SIDE, MAX_SIDE, 0, bytes(range(256)) * (MAX_SIDE // 256))
    assert out.shape == (1, MAX_SIDE, 3) and out[0, 255, 2] == 255


GOOD = {"encoding": "rgb8", "height": H, "width": W, "step": W * 3 + 1, "is_bigendian": 0,
        "data": bytes((W * 3 + 1) * H)}

RAW_MALFORMED = [
    ({"encoding": "nv24"}, "unknown_encoding"),  # in sensor_msgs (YUV 4:4:4), but OpenCV has no conversion
    ({"encoding": "RGB8"}, "unknown_encoding"),
    ({"encoding": ""}, "unknown_encoding"),
    ({"encoding": None}, "unknown_encoding"),
    ({"height": 0}, "bad_dimensions"),
    ({"width": 0}, "bad_dimensions"),
    ({"height": -1}, "bad_dimensions"),
    ({"width": MAX_SIDE + 1}, "bad_dimensions"),
    ({"height": 2**40}, "bad_dimensions"),
    ({"height": 5.0}, "bad_dimensions"),
    ({"width": "7"}, "bad_dimensions"),
    ({"encoding": "yuv422"}, "bad_dimensions"),  # 4:2:2 with the odd width 7
    ({"encoding": "yuyv", "width": 1}, "bad_dimensions"),
    ({"encoding": "nv12", "width": 6}, "bad_dimensions"),  # 4:2:0 with the odd height 5
    ({"encoding": "nv21", "height": 4}, "bad_dimensions"),  # 4:2:0 with the odd width 7
    ({"encoding": "bayer_rggb8", "height": 2}, "bad_dimensions"),  # no 3 x 3 neighbourhood to demosaic
    ({"encoding": "bayer_gbrg16", "width": 1}, "bad_dimensions"),
    ({"step": W * 3 - 1}, "bad_step"),
    ({"step": 0}, "bad_step"),
    ({"step": -(W * 3)}, "bad_step"),
    ({"step": None}, "bad_step"),
    ({"encoding": "rgba8"}, "bad_step"),  # step fits 3 bytes per pixel, not 4
    ({"encoding": "uyvy", "width": 6, "step": 11}, "bad_step"),  # 2 bytes per pixel: 12
    ({"encoding": "bayer_bggr16", "step": 13}, "bad_step"),  # 2 bytes per pixel: 14
    ({"is_bigendian": "yes"}, "bad_endianness"),
    ({"is_bigendian": None}, "bad_endianness"),
    ({"data": None}, "bad_data"),
    ({"data": "text"}, "bad_data"),
    ({"data": [0] * 200}, "bad_data"),
    ({"data": memoryview(bytes(400))[::2]}, "bad_data"),  # not contiguous
    ({"data": np.zeros((H, W * 3 + 1, 2), np.uint8)[:, :, 0]}, "bad_data"),
    ({"data": bytes((W * 3 + 1) * H - 1)}, "short_buffer"),  # the last row's padding is still required
    ({"data": b""}, "short_buffer"),
    ({"step": 10**9}, "short_buffer"),
    ({"encoding": "yuv422_yuy2", "width": 6, "step": 12, "data": bytes(12 * H - 1)}, "short_buffer"),
    ({"encoding": "nv12", "height": 4, "width": 6, "step": 6, "data": bytes(6 * 4)}, "short_buffer"),  # no chroma
    ({"encoding": "nv21", "height": 4, "width": 6, "step": 8, "data": bytes(8 * 6 - 1)}, "short_buffer"),
    ({"encoding": "bayer_grbg16", "step": 14, "data": bytes(14 * H - 1)}, "short_buffer"),
]


@pytest.mark.parametrize("override, reason", RAW_MALFORMED)
def test_raw_malformed_cases_carry_their_reason(override, reason):
    with pytest.raises(ImageDecodeError) as info:
        decode_raw(**{**GOOD, **override})
    assert info.value.reason == reason
    assert isinstance(info.value, ValueError) and str(info.value)


@pytest.mark.parametrize("encoding, height, width, expected", [
    ("yuv422", 4, 7, "yuv422 is YUV 4:2:2: its width must be even, not 7"),
    ("nv12", 5, 6, "nv12 is YUV 4:2:0: its height must be even, not 5"),
    ("bayer_rggb8", 2, 640, "640x2 is too small for bayer_rggb8: demosaicing needs at least 3 x 3 pixels"),
])
def test_impossible_sizes_say_why(encoding, height, width, expected):
    with pytest.raises(ImageDecodeError, match=expected) as info:
        decode_raw(encoding, height, width, width * 2, 0, bytes(width * 2 * height * 2))
    assert info.value.reason == "bad_dimensions"


def _bgr_gradient(height: int = 32, width: int = 48) -> np.ndarray:
    """Smooth, so JPEG's error stays small and a channel swap would still be obvious."""
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 255 // (width - 1), y * 255 // (height - 1), np.full_like(x, 200)], axis=2).astype(np.uint8)


def _encode(ext: str, image: np.ndarray) -> bytes:
    ok, payload = cv2.imencode(ext, image)
    assert ok
    return payload.tobytes()


@pytest.mark.parametrize("fmt", ["jpeg", "jpg", "JPEG", "rgb8; jpeg compressed bgr8", "bgr8; jpeg compressed bgr8"])
def test_jpeg_within_lossy_tolerance(fmt):
    bgr = _bgr_gradient()
    out = decode_compressed(fmt, _encode(".jpg", bgr))
    _assert_fresh_rgb(out, *bgr.shape[:2])
    error = np.abs(out.astype(int) - bgr[..., ::-1])
    assert error.mean() < 3 and error.max() < 24


@pytest.mark.parametrize("fmt", ["png", "bgr8; png compressed bgr8", "rgb8; png compressed bgr8"])
def test_png_colour_is_exact(fmt):
    bgr = _rgb(9, 11)[..., ::-1]
    out = decode_compressed(fmt, array.array("B", _encode(".png", bgr)))
    _assert_fresh_rgb(out, 9, 11)
    np.testing.assert_array_equal(out, bgr[..., ::-1])


def test_png_gray_alpha_and_16_bit_become_rgb():
    rgb = _rgb(4, 6)
    gray = rgb[..., 0]
    expected_gray = np.repeat(gray[..., None], 3, axis=2)
    np.testing.assert_array_equal(decode_compressed("mono8; png compressed mono8", _encode(".png", gray)),
                                  expected_gray)
    bgra = np.concatenate([rgb[..., ::-1], np.full((4, 6, 1), 9, np.uint8)], axis=2)
    np.testing.assert_array_equal(decode_compressed("png", _encode(".png", bgra)), rgb)
    gray16 = gray.astype(np.uint16) << 8 | np.uint16(0xF0)  # low byte must not round the value up
    np.testing.assert_array_equal(decode_compressed("mono16; png compressed mono16", _encode(".png", gray16)),
                                  expected_gray)


def test_jpeg_gray_becomes_rgb():
    gray = _bgr_gradient()[..., 0]
    out = decode_compressed("jpeg", _encode(".jpg", gray))
    assert out.shape == (*gray.shape, 3)
    assert np.abs(out.astype(int) - gray[..., None]).max() < 8


def _forged_png(width: int, height: int) -> bytes:
    payload = bytearray(_encode(".png", _rgb(2, 2)))
    payload[16:24] = width.to_bytes(4, "big") + height.to_bytes(4, "big")
    return bytes(payload)


def _forged_jpeg(width: int, height: int) -> bytes:
    payload = bytearray(_encode(".jpg", _bgr_gradient(8, 8)))
    sof = payload.index(b"\xff\xc0")
    payload[sof + 5:sof + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return bytes(payload)


def _png_with_chunk_length(chunk: bytes, length: int) -> bytes:
    """PNG whose `chunk` claims `length` bytes: OpenCV would allocate that much unless refused first."""
    payload = bytearray(PNG)
    at = payload.index(chunk) - 4
    payload[at:at + 4] = length.to_bytes(4, "big")
    return bytes(payload)


PNG = _encode(".png", _rgb(8, 8))
JPEG = _encode(".jpg", _bgr_gradient(16, 16))

COMPRESSED_MALFORMED = [
    ("tiff", PNG, "unsupported_format"),
    ("", PNG, "unsupported_format"),
    ("jpeg png", PNG, "unsupported_format"),
    ("16UC1; compressedDepth png", PNG, "unsupported_format"),
    (None, PNG, "unsupported_format"),
    ("png", None, "bad_data"),
    ("jpeg", "not bytes", "bad_data"),
    ("png", b"", "undecodable"),
    ("jpeg", b"", "undecodable"),
    ("png", JPEG, "undecodable"),  # the payload must be the codec the format names
    ("jpeg", PNG, "undecodable"),
    ("png", PNG[:20], "undecodable"),  # header cut short
    ("png", PNG[:40], "undecodable"),  # header whole, image data missing
    ("jpeg", JPEG[:4], "undecodable"),
    ("jpeg", JPEG[:2] + b"\xff\xda" + JPEG[4:], "undecodable"),  # scan before any frame header
    ("png", _png_with_chunk_length(b"IDAT", 2**31 - 1), "undecodable"),
    ("png", _png_with_chunk_length(b"IEND", 805306368), "undecodable"),
    ("png", _forged_png(MAX_SIDE + 1, 2), "bad_dimensions"),  # refused before OpenCV allocates
    ("png", _forged_png(2**31, 2**31), "bad_dimensions"),
    ("png", _forged_png(0, 8), "bad_dimensions"),
    ("jpeg", _forged_jpeg(60000, 60000), "bad_dimensions"),
    ("jpeg", _forged_jpeg(8, 0), "bad_dimensions"),
]


@pytest.mark.parametrize("fmt, data, reason", COMPRESSED_MALFORMED)
def test_compressed_malformed_cases_carry_their_reason(fmt, data, reason):
    with pytest.raises(ImageDecodeError) as info:
        decode_compressed(fmt, data)
    assert info.value.reason == reason and str(info.value)


def test_every_reason_is_declared_and_exercised():
    exercised = {reason for _, reason in RAW_MALFORMED} | {reason for *_, reason in COMPRESSED_MALFORMED}
    assert exercised == REASONS
    assert set(SUPPORTED_COMPRESSED_FORMATS) == {"jpeg", "png"}


def _call(fn, *args) -> np.ndarray | None:
    """Run one fuzz case: a frame, or None for an ImageDecodeError with a declared reason."""
    try:
        return fn(*args)
    except ImageDecodeError as exc:
        assert exc.reason in REASONS, exc.reason
        return None


def test_fuzz_only_image_decode_error_escapes():
    rng = np.random.default_rng(1234)
    encodings = [*SUPPORTED_ENCODINGS, "bgr16", "32FC1", "nv24", "", "mono"]
    wrappers = [bytes, bytearray, lambda b: array.array("B", b), memoryview]
    decoded = rejected = 0
    for _ in range(3000):
        encoding = encodings[rng.integers(len(encodings))]
        height, width = (int(v) for v in rng.integers(-2, 24, 2))
        if rng.random() < 0.05:
            height = int(rng.choice([MAX_SIDE + 1, 2**31, 2**63]))
        step = max(width, 0) * int(rng.integers(0, 6)) + int(rng.integers(-3, 4))
        length = max(0, step * max(height, 0) + int(rng.integers(-4, 5)))
        data = wrappers[rng.integers(len(wrappers))](rng.bytes(min(length, 4096)))
        out = _call(decode_raw, encoding, height, width, step, int(rng.integers(0, 3)), data)
        if out is None:
            rejected += 1
        else:
            decoded += 1
            assert out.shape == (height, width, 3) and out.dtype == np.uint8
    formats = ["jpeg", "png", "rgb8; jpeg compressed bgr8", "bgr8; png compressed bgr8", "gif", ""]
    for _ in range(1500):
        payload = bytearray((JPEG, PNG)[rng.integers(2)])
        kind = rng.integers(3)
        if kind == 0:  # truncated
            payload = payload[: rng.integers(len(payload) + 1)]
        elif kind == 1:  # corrupted bytes, header included
            for index in rng.integers(0, len(payload), rng.integers(1, 8)):
                payload[index] = rng.integers(256)
        else:  # random bytes behind a valid-looking signature
            payload = payload[: rng.integers(0, 40)] + bytearray(rng.bytes(rng.integers(0, 200)))
        out = _call(decode_compressed, formats[rng.integers(len(formats))], bytes(payload))
        if out is None:
            rejected += 1
        else:
            decoded += 1
            assert out.ndim == 3 and out.shape[2] == 3 and out.dtype == np.uint8
    assert decoded > 100 and rejected > 100  # the fuzz reached both sides


def test_module_imports_no_ros():
    code = ("import sys, vla_edge_ros.runtime.image_codec; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('rclpy', 'sensor_msgs', 'cv_bridge')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
