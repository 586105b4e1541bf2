"""raster.c: the built-in envs' rasterizer (filled polygons, circles, lines),
checked pixel by pixel against its documented sampling rule (pixel (x, y) is
covered when the point (x, y) is inside the shape), clipping and the y flip."""
from __future__ import annotations

import ctypes

import cbuild
import numpy as np
import pytest

RED, BLUE = (255, 0, 0), (0, 0, 255)


class Color(ctypes.Structure):
    _fields_ = [("r", ctypes.c_uint8), ("g", ctypes.c_uint8), ("b", ctypes.c_uint8)]


class Raster(ctypes.Structure):
    _fields_ = [("rgb", ctypes.c_void_p), ("width", ctypes.c_int32),
                ("height", ctypes.c_int32), ("flip_y", ctypes.c_bool)]


@pytest.fixture(scope="module")
def lib():
    lib = cbuild.load(["raster.c"])
    d = ctypes.c_double
    lib.envd_raster_fill.argtypes = [ctypes.POINTER(Raster), Color]
    lib.envd_raster_polygon.argtypes = [ctypes.POINTER(Raster), ctypes.POINTER(d), ctypes.c_int,
                                        Color]
    lib.envd_raster_circle.argtypes = [ctypes.POINTER(Raster), d, d, d, Color]
    lib.envd_raster_line.argtypes = [ctypes.POINTER(Raster), d, d, d, d, Color]
    return lib


class Canvas:
    """A frame and its raster; pixels() gives the mask of one colour."""

    def __init__(self, lib, width: int, height: int, flip_y: bool = False):
        self.lib = lib
        self.rgb = np.zeros((height, width, 3), np.uint8)
        self.raster = Raster(self.rgb.ctypes.data, width, height, flip_y)

    def polygon(self, xy, color=RED):
        coords = (ctypes.c_double * len(xy))(*xy)
        self.lib.envd_raster_polygon(ctypes.byref(self.raster), coords, len(xy) // 2,
                                     Color(*color))

    def circle(self, cx, cy, radius, color=RED):
        self.lib.envd_raster_circle(ctypes.byref(self.raster), cx, cy, radius, Color(*color))

    def line(self, x0, y0, x1, y1, color=RED):
        self.lib.envd_raster_line(ctypes.byref(self.raster), x0, y0, x1, y1, Color(*color))

    def fill(self, color):
        self.lib.envd_raster_fill(ctypes.byref(self.raster), Color(*color))

    def pixels(self, color=RED) -> np.ndarray:
        return (self.rgb == np.array(color, np.uint8)).all(axis=2)


def test_fill_covers_every_pixel(lib):
    c = Canvas(lib, 7, 5)
    c.fill(BLUE)
    assert c.pixels(BLUE).all()


def test_rectangle_covers_exactly_its_integer_points_edges_included(lib):
    c = Canvas(lib, 10, 8)
    c.polygon([2, 1, 2, 4, 6, 4, 6, 1])
    expected = np.zeros((8, 10), bool)
    expected[1:5, 2:7] = True  # the closed rectangle: rows 1..4, cols 2..6
    assert (c.pixels() == expected).all(), c.pixels().astype(int)


def test_triangle_matches_the_point_in_polygon_rule(lib):
    c = Canvas(lib, 40, 30)
    xy = [3.3, 2.7, 35.1, 10.2, 12.6, 27.9]
    c.polygon(xy)
    (ax, ay), (bx, by), (qx, qy) = np.array(xy).reshape(3, 2)
    ys, xs = np.mgrid[0:30, 0:40]

    def side(px, py, x0, y0, x1, y1):
        return (x1 - x0) * (py - y0) - (y1 - y0) * (px - x0)
    inside = ((side(xs, ys, ax, ay, bx, by) >= 0) & (side(xs, ys, bx, by, qx, qy) >= 0)
              & (side(xs, ys, qx, qy, ax, ay) >= 0))
    # the fill may differ from the exact rule only on the boundary
    assert (c.pixels() != inside).sum() <= 3
    assert inside.sum() > 200


def test_circle_covers_the_disc(lib):
    c = Canvas(lib, 30, 30)
    c.circle(15, 14, 6)
    ys, xs = np.mgrid[0:30, 0:30]
    disc = (xs - 15) ** 2 + (ys - 14) ** 2 <= 36
    assert (c.pixels() == disc).all()


def test_line_joins_its_ends_one_pixel_per_column(lib):
    c = Canvas(lib, 20, 10)
    c.line(1, 2, 18, 7)
    mask = c.pixels()
    assert mask[2, 1] and mask[7, 18]
    assert mask.sum(axis=0)[1:19].tolist() == [1] * 18 and mask.sum() == 18


def test_flip_y_puts_y_zero_on_the_bottom_row(lib):
    c = Canvas(lib, 6, 5, flip_y=True)
    c.line(0, 0, 5, 0)
    c.circle(2, 4, 0, BLUE)
    assert c.pixels()[4].all() and c.pixels().sum() == 6
    assert c.pixels(BLUE)[0, 2] and c.pixels(BLUE).sum() == 1


def test_shapes_outside_the_frame_are_clipped(lib):
    c = Canvas(lib, 8, 6)
    c.polygon([-100, -50, 300, -40, 200, 400])
    c.circle(-1e6, 3, 1e3)
    c.line(-1e300, 0, 1e300, 1e300)
    c.line(-1.7e308, 2, 1.7e308, 2)  # the difference overflows to inf
    c.polygon([float("inf"), 1, float("inf"), 4, 3, 4])
    assert c.pixels().any()
    c.circle(4, 3, 1e9, BLUE)
    assert c.pixels(BLUE).all()  # the huge disc covered everything, drawn last


def test_degenerate_input_draws_nothing(lib):
    c = Canvas(lib, 8, 6)
    c.polygon([1, 1, 5, 5])  # two vertices
    c.polygon([1, 1, 5, 5, float("nan"), 2])
    c.circle(float("nan"), 2, 3)
    c.circle(2, 2, -1)
    c.line(0, 0, float("inf"), 3)
    assert not c.rgb.any()


# ---- the classic-control render functions on any state ------------------------------
CLASSIC_SYMBOLS = {"envd_builtin_cartpole": 4, "envd_builtin_pendulum": 2,
                   "envd_builtin_mountain_car": 2, "envd_builtin_mountain_car_continuous": 2,
                   "envd_builtin_acrobot": 4}  # -> leading float64 state entries


@pytest.fixture(scope="module")
def envs_ubsan():
    """The classic envs built with UBSan, float-cast-overflow included, aborting
    on the first report: a float-to-int conversion of a NaN or huge coordinate
    stops the run (and a loop over such a span would hang: the test timeout)."""
    sources = ["rng.c", "raster.c", "npy_f32_trig.c", "envs/cartpole.c", "envs/pendulum.c",
               "envs/mountain_car.c", "envs/mountain_car_continuous.c", "envs/acrobot.c"]
    return cbuild.load(sources, ["-fsanitize=undefined,float-cast-overflow", "-fno-sanitize-recover=all", "-g"])


@pytest.mark.parametrize("symbol", sorted(CLASSIC_SYMBOLS))
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1e300, 1e18, 12345.678])
def test_classic_frames_of_extreme_states(envs_ubsan, symbol, value):
    """States no episode reaches from a reset (a cart stepped far past its
    termination with the time limit off, a diverged value) still draw a
    frame: the render callbacks clip and never convert NaN or huge floats to
    integers."""
    env = cbuild.SingleEnv(envs_ubsan, symbol)
    env.reset(seed=0)
    d = env.define
    frame = np.full((d.render_height, d.render_width, 3), 17, np.uint8)
    state = np.frombuffer(env._state, np.float64, CLASSIC_SYMBOLS[symbol])
    state[...] = value
    assert d.render(env._state, frame.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))) == 0
    assert not (frame == 17).all(axis=2).any()  # every pixel written (background at least)
