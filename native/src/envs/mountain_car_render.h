/*
 * mountain_car_render.h -- the frame of both mountain cars (gymnasium draws
 * them with the same code; only the goal position differs).  Included by
 * mountain_car.c and mountain_car_continuous.c.
 */
#ifndef ENVD_MOUNTAIN_CAR_RENDER_H
#define ENVD_MOUNTAIN_CAR_RENDER_H

#include <math.h>

#include "raster.h"

#define MC_SCREEN_WIDTH 600
#define MC_SCREEN_HEIGHT 400
#define MC_MIN_POSITION (-1.2)
#define MC_MAX_POSITION 0.6

static inline double mc_height(double x) { return sin(3 * x) * .45 + .55; }

/* gymnasium's MountainCarEnv.render geometry (600x400, y up). */
static inline void mountain_car_draw(uint8_t *rgb, double pos, double goal_position)
{
    envd_raster_t r = {rgb, MC_SCREEN_WIDTH, MC_SCREEN_HEIGHT, true};
    const double scale = MC_SCREEN_WIDTH / (MC_MAX_POSITION - MC_MIN_POSITION);
    const double carwidth = 40, carheight = 20, clearance = 10;
    const envd_color_t black = {0, 0, 0};
    envd_raster_fill(&r, (envd_color_t){255, 255, 255});
    /* the track: 100 points as np.linspace(min, max, 100), joined by lines */
    double px = 0, py = 0;
    for (int k = 0; k < 100; k++) {
        double x = MC_MIN_POSITION + (MC_MAX_POSITION - MC_MIN_POSITION) * k / 99.0;
        double sx = (x - MC_MIN_POSITION) * scale, sy = mc_height(x) * scale;
        if (k > 0)
            envd_raster_line(&r, px, py, sx, sy, black);
        px = sx, py = sy;
    }
    const double angle = cos(3 * pos);
    const double cx = (pos - MC_MIN_POSITION) * scale;
    const double cy = clearance + mc_height(pos) * scale;
    double car[8];
    envd_raster_box(-carwidth / 2, carwidth / 2, 0, carheight, angle, cx, cy, car);
    envd_raster_polygon(&r, car, 4, black);
    for (int side = 1; side >= -1; side -= 2) {
        double wx, wy;
        envd_raster_rotate(side * carwidth / 4, 0, angle, &wx, &wy);
        envd_raster_circle(&r, envd_raster_trunc(wx + cx), envd_raster_trunc(wy + cy),
                           (int)(carheight / 2.5),
                           (envd_color_t){128, 128, 128});
    }
    const int flagx = (int)((goal_position - MC_MIN_POSITION) * scale);
    const int flagy1 = (int)(mc_height(goal_position) * scale), flagy2 = flagy1 + 50;
    envd_raster_line(&r, flagx, flagy1, flagx, flagy2, black);
    const double flag[6] = {flagx, flagy2, flagx, flagy2 - 10, flagx + 25, flagy2 - 5};
    envd_raster_polygon(&r, flag, 3, (envd_color_t){204, 204, 0});
}

#endif /* ENVD_MOUNTAIN_CAR_RENDER_H */
