/*
 * raster.c -- see raster.h.  Every primitive clips to the frame, so an env
 * may draw shapes partly or wholly outside it (a cart past the edge).
 */
#include <math.h>
#include <stdlib.h>

#include "raster.h"

/* The frame row of y (y up when flip_y). */
static double row_of(const envd_raster_t *r, double y)
{
    return r->flip_y ? (double)(r->height - 1) - y : y;
}

static void put(envd_raster_t *r, int64_t x, int64_t row, envd_color_t c)
{
    if (x < 0 || x >= r->width || row < 0 || row >= r->height)
        return;
    uint8_t *p = r->rgb + ((size_t)row * (size_t)r->width + (size_t)x) * 3;
    p[0] = c.r;
    p[1] = c.g;
    p[2] = c.b;
}

/* Pixels x0..x1 (inclusive, clipped) of one row. */
static void span(envd_raster_t *r, int64_t row, double x0, double x1, envd_color_t c)
{
    if (row < 0 || row >= r->height || !(x0 <= x1))
        return;
    double lo = fmax(ceil(x0), 0.0), hi = fmin(floor(x1), (double)r->width - 1);
    if (!(lo <= hi)) /* off the frame: lo may be +inf, not an integer to convert */
        return;
    for (int64_t x = (int64_t)lo; (double)x <= hi; x++)
        put(r, x, row, c);
}

void envd_raster_fill(envd_raster_t *r, envd_color_t color)
{
    for (int64_t row = 0; row < r->height; row++)
        span(r, row, 0, (double)r->width - 1, color);
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void envd_raster_polygon(envd_raster_t *r, const double *xy, int n, envd_color_t color)
{
    if (n < 3 || n > ENVD_RASTER_MAX_VERTICES)
        return;
    double rows[ENVD_RASTER_MAX_VERTICES];
    double top = INFINITY, bottom = -INFINITY;
    for (int k = 0; k < n; k++) {
        rows[k] = row_of(r, xy[2 * k + 1]);
        top = fmin(top, rows[k]);
        bottom = fmax(bottom, rows[k]);
    }
    if (!isfinite(top) || !isfinite(bottom))
        return;
    top = fmax(ceil(top), 0.0);
    bottom = fmin(floor(bottom), (double)r->height - 1);
    if (!(top <= bottom)) /* off the frame (converting top could overflow) */
        return;
    for (int64_t row = (int64_t)top; (double)row <= bottom; row++) {
        /* Crossings of the row with each edge, half-open in y so a vertex on
         * the row counts once; an edge lying on the row adds both ends. */
        double xs[2 * ENVD_RASTER_MAX_VERTICES];
        int m = 0;
        double y = (double)row;
        for (int k = 0; k < n; k++) {
            int j = (k + 1) % n;
            double ya = rows[k], yb = rows[j], xa = xy[2 * k], xb = xy[2 * j];
            if (ya == yb) {
                if (ya == y) /* a horizontal edge on this row: draw it */
                    span(r, row, fmin(xa, xb), fmax(xa, xb), color);
                continue;
            }
            if ((y >= ya && y < yb) || (y >= yb && y < ya))
                xs[m++] = xa + (y - ya) * (xb - xa) / (yb - ya);
        }
        qsort(xs, (size_t)m, sizeof xs[0], compare_doubles);
        for (int k = 0; k + 1 < m; k += 2)
            span(r, row, xs[k], xs[k + 1], color);
    }
}

void envd_raster_circle(envd_raster_t *r, double cx, double cy, double radius,
                        envd_color_t color)
{
    if (!(radius >= 0) || !isfinite(cx) || !isfinite(cy))
        return;
    double crow = row_of(r, cy);
    double top = fmax(ceil(crow - radius), 0.0);
    double bottom = fmin(floor(crow + radius), (double)r->height - 1);
    if (!(top <= bottom))
        return;
    for (int64_t row = (int64_t)top; (double)row <= bottom; row++) {
        double dy = (double)row - crow;
        double half = sqrt(fmax(radius * radius - dy * dy, 0.0));
        span(r, row, cx - half, cx + half, color);
    }
}

void envd_raster_line(envd_raster_t *r, double x0, double y0, double x1, double y1,
                      envd_color_t color)
{
    if (!isfinite(x0) || !isfinite(y0) || !isfinite(x1) || !isfinite(y1))
        return;
    double r0 = row_of(r, y0), r1 = row_of(r, y1);
    /* one pixel per step along the longer axis (a DDA); the clip in put()
     * bounds the work only by the frame when the caller's line is long */
    double dx = x1 - x0, dy = r1 - r0;
    double steps = fmin(fmax(fabs(dx), fabs(dy)), 4.0 * (r->width + r->height));
    int64_t n = (int64_t)ceil(steps);
    for (int64_t k = 0; k <= n; k++) {
        double t = n == 0 ? 0.0 : (double)k / (double)n;
        double x = x0 + t * dx, row = r0 + t * dy;
        if (x > -1.0 && x < (double)r->width && row > -1.0 && row < (double)r->height)
            put(r, (int64_t)lround(x), (int64_t)lround(row), color); /* in range: defined */
    }
}
