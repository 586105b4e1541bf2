/*
 * raster.h -- a small software rasterizer for the built-in envs' render
 * callbacks: filled polygons, circles and lines on an RGB frame.
 *
 * Coordinates are pixels, sampled at integer positions (pixel (x, y) is
 * covered when the point (x, y) is inside the shape or on its boundary, up to
 * rounding), as pygame.gfxdraw does
 * with the integer coordinates gymnasium's classic-control renderers pass it.
 * With flip_y the y axis points up (y = 0 is the bottom row): gymnasium draws
 * that way and flips the surface at the end.  No anti-aliasing.
 *
 * Part of the host, not of envd.h: a plugin draws its own frames (it may copy
 * this file; it depends on nothing else).
 */
#ifndef ENVD_RASTER_H
#define ENVD_RASTER_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct envd_color {
    uint8_t r, g, b;
} envd_color_t;

typedef struct envd_raster {
    uint8_t *rgb;          /* height rows of width pixels of 3 bytes */
    int32_t width, height; /* >= 1 */
    bool flip_y;           /* y grows upwards */
} envd_raster_t;

/* Most vertices of one polygon (every built-in draws quads and triangles). */
#define ENVD_RASTER_MAX_VERTICES 16

/* Python's int(x) of a pixel coordinate (gymnasium truncates circle centres),
 * kept within +-1e9 so that the conversion is defined whatever the state:
 * NaN and infinities land far outside any frame and draw nothing. */
static inline double envd_raster_trunc(double x)
{
    if (!(x > -1e9)) /* NaN too */
        return -1e9;
    return x > 1e9 ? 1e9 : trunc(x);
}

/* (x, y) turned counter-clockwise by angle, as pygame's Vector2.rotate_rad. */
static inline void envd_raster_rotate(double x, double y, double angle, double *ox, double *oy)
{
    double c = cos(angle), s = sin(angle);
    *ox = x * c - y * s;
    *oy = x * s + y * c;
}

/* The quad l..r x b..t turned by angle, then moved by (dx, dy): xy gets 8
 * numbers in the corner order gymnasium uses ((l,b), (l,t), (r,t), (r,b)). */
static inline void envd_raster_box(double l, double r, double b, double t, double angle,
                                   double dx, double dy, double xy[8])
{
    const double corners[8] = {l, b, l, t, r, t, r, b};
    for (int k = 0; k < 4; k++) {
        envd_raster_rotate(corners[2 * k], corners[2 * k + 1], angle, &xy[2 * k], &xy[2 * k + 1]);
        xy[2 * k] += dx;
        xy[2 * k + 1] += dy;
    }
}

void envd_raster_fill(envd_raster_t *r, envd_color_t color);
/* A filled polygon of n (3..ENVD_RASTER_MAX_VERTICES) vertices xy[2k], xy[2k+1],
 * convex or not (even-odd rule); other n draw nothing. */
void envd_raster_polygon(envd_raster_t *r, const double *xy, int n, envd_color_t color);
/* A filled disc of the given radius (>= 0) around (cx, cy). */
void envd_raster_circle(envd_raster_t *r, double cx, double cy, double radius,
                        envd_color_t color);
/* A one-pixel-wide line from (x0, y0) to (x1, y1), both ends included. */
void envd_raster_line(envd_raster_t *r, double x0, double y0, double x1, double y1,
                      envd_color_t color);

#endif /* ENVD_RASTER_H */
