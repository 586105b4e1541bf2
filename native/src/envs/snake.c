/*
 * Snake-v0: the classic snake game as a pixel env (large-observation
 * benchmarks).
 *
 * Spec (tests/native/test_snake.py holds an independent Python reference of
 * the same spec):
 *   - The grid is 12 x 12 cells, row 0 at the top.  The observation is
 *     Box(0, 255, (84, 84), uint8), row-major: each cell is a whole 7 x 7
 *     block of pixels, cell (r, c) covering pixel rows 7r..7r+6 and columns
 *     7c..7c+6.  Pixel values: empty 0, food 64, snake body 128, head 255.
 *   - Action Discrete(4), absolute directions: 0 up (row - 1), 1 right
 *     (col + 1), 2 down (row + 1), 3 left (col - 1).  The action opposite to
 *     the current heading (which would reverse the snake onto its neck) is
 *     ignored: the snake keeps its current heading.  The heading is the
 *     direction of the last move (right after a reset).
 *   - reset: a snake of length 3, horizontal, head at (6, 6) heading right,
 *     body at (6, 5) and (6, 4); then food is placed.
 *   - Food placement: k = number of free cells (cells not covered by the
 *     snake), index = (int)(envd_rng_random(rng) * k), and the food goes on
 *     the index-th free cell in row-major order.  One RNG draw per placement
 *     (numpy: int(np.random.default_rng(seed).random() * k)), none when no
 *     cell is free.
 *   - step: new head = head + heading.
 *       * It leaves the grid, or it lands on a snake cell other than the tail
 *         (the tail cell counts as free: the snake is not growing on such a
 *         step, since food is never on the snake, so the tail moves away):
 *         reward -1, terminated.  Decision: the observation is the state
 *         before the fatal move (the image does not change; a head off the
 *         grid could not be drawn anyway).
 *       * It lands on the food: the snake grows by one (the tail stays),
 *         reward +1, and new food is placed.  When the snake then covers the
 *         whole grid (no free cell, no draw), the episode terminates with the
 *         win, reward +1, and the observation shows the full snake.
 *       * Otherwise the snake moves (the tail advances), reward 0.
 *     A step after termination (the host never does it: it resets first)
 *     changes nothing and reports reward 0, terminated.  A step before the
 *     first reset, or an action outside 0..3 (the host checks actions), is
 *     refused with ENVD_ESTATE / ENVD_EINVAL.
 *   - No parameters.  Default time limit 1000 steps (applied by the host).
 *
 * State: the body as a ring buffer of cell indices, and a cell grid holding
 * each cell's pixel value (occupancy and image in one; ~300 bytes, nothing
 * allocated).  A step updates at most four cells of the grid (new head, old
 * head, old tail, new food) and renders the whole image from it: 12 pixel
 * rows built with memset, each copied six times.  Measured against keeping a
 * rendered 7 KiB image per instance and memcpy-ing it out, full rendering is
 * as fast or faster at 1024 instances (the cached images double the memory a
 * step touches), and the state stays small.
 */
#include <string.h>

#include "envd.h"
#include "raster.h"

#define GRID 12
#define CELLS (GRID * GRID)
#define CELL_PX 7
#define SIDE (GRID * CELL_PX) /* 84 */
#define OBS_N (SIDE * SIDE)

enum { PX_EMPTY = 0, PX_FOOD = 64, PX_BODY = 128, PX_HEAD = 255 };
enum { UP = 0, RIGHT = 1, DOWN = 2, LEFT = 3 };

typedef struct snake {
    uint8_t body[CELLS]; /* ring buffer of cell indices r * GRID + c */
    int32_t head;        /* ring position of the head */
    int32_t length;      /* cells of the snake; its tail is at head - (length - 1) */
    int32_t dir;         /* current heading, UP..LEFT */
    int32_t over;        /* the episode terminated */
    uint8_t grid[CELLS]; /* each cell's pixel value */
} snake_t;

static const double obs_low[OBS_N]; /* all 0 */
static const double obs_high[OBS_N] = {[0 ... OBS_N - 1] = 255.0};

static const int8_t dr[4] = {-1, 0, 1, 0};
static const int8_t dc[4] = {0, 1, 0, -1};

/* Draw the grid into obs: one pixel row per cell row, then six copies of it. */
static void render(const snake_t *s, unsigned char *obs)
{
    for (int r = 0; r < GRID; r++) {
        unsigned char *row = obs + (size_t)r * CELL_PX * SIDE;
        for (int c = 0; c < GRID; c++)
            memset(row + c * CELL_PX, s->grid[r * GRID + c], CELL_PX);
        for (int y = 1; y < CELL_PX; y++)
            memcpy(row + y * SIDE, row, SIDE);
    }
}

static int ring(int pos) { return pos < 0 ? pos + CELLS : pos >= CELLS ? pos - CELLS : pos; }

/* Food on the index-th free cell (row-major), index = floor(random * free). */
static void place_food(snake_t *s, envd_rng_t *rng)
{
    int free_cells = CELLS - s->length;
    if (free_cells <= 0)
        return;
    int index = (int)(envd_rng_random(rng) * free_cells);
    for (int cell = 0; cell < CELLS; cell++)
        if (s->grid[cell] == PX_EMPTY && index-- == 0) {
            s->grid[cell] = PX_FOOD;
            return;
        }
}

static int snake_init(void *state, const double *params)
{
    (void)state; /* zeroed by the host (length 0: not reset yet); reset builds the episode */
    (void)params;
    return ENVD_OK;
}

static int snake_reset(void *state, envd_rng_t *rng, void *obs)
{
    snake_t *s = state;
    memset(s->grid, PX_EMPTY, sizeof s->grid);
    const int row = 6, col = 6;
    s->length = 3;
    s->head = 2;
    s->dir = RIGHT;
    s->over = 0;
    for (int k = 0; k < 3; k++) { /* ring positions 0, 1, 2: tail to head */
        int cell = row * GRID + col - 2 + k;
        s->body[k] = (uint8_t)cell;
        s->grid[cell] = k == 2 ? PX_HEAD : PX_BODY;
    }
    place_food(s, rng);
    render(s, obs);
    return ENVD_OK;
}

static int snake_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                      double *reward, bool *terminated, bool *truncated)
{
    snake_t *s = state;
    int64_t a = *(const int64_t *)action;
    if (a < 0 || a > 3)
        return ENVD_EINVAL;
    if (s->length == 0) /* never reset */
        return ENVD_ESTATE;
    *truncated = false;
    if (s->over) {
        *reward = 0.0;
        *terminated = true;
        render(s, obs);
        return ENVD_OK;
    }
    if ((int)a != (s->dir ^ 2)) /* UP^2 == DOWN, RIGHT^2 == LEFT */
        s->dir = (int)a;

    int head = s->body[s->head];
    int r = head / GRID + dr[s->dir], c = head % GRID + dc[s->dir];
    int tail_pos = ring(s->head - (s->length - 1));
    int cell = r * GRID + c;
    if (r < 0 || r >= GRID || c < 0 || c >= GRID ||
        ((s->grid[cell] == PX_BODY || s->grid[cell] == PX_HEAD) && cell != s->body[tail_pos])) {
        s->over = 1;
        *reward = -1.0;
        *terminated = true;
        render(s, obs);
        return ENVD_OK;
    }

    bool eats = s->grid[cell] == PX_FOOD;
    if (!eats) /* the tail moves away first: the new head may take its cell */
        s->grid[s->body[tail_pos]] = PX_EMPTY;
    else
        s->length++;
    s->grid[head] = PX_BODY;
    s->head = ring(s->head + 1);
    s->body[s->head] = (uint8_t)cell;
    s->grid[cell] = PX_HEAD;

    *reward = eats ? 1.0 : 0.0;
    *terminated = false;
    if (eats) {
        if (s->length == CELLS) {
            s->over = 1;
            *terminated = true; /* the snake fills the grid: a win */
        } else {
            place_food(s, rng);
        }
    }
    render(s, obs);
    return ENVD_OK;
}

/* The frame (render_mode="rgb_array"): the grid at 20 px per cell, in colour:
 * empty black, food red, body green, head light green. */
#define FRAME_CELL_PX 20
#define FRAME_SIDE (GRID * FRAME_CELL_PX)

static int snake_render(const void *state, uint8_t *rgb)
{
    const snake_t *s = state;
    envd_raster_t r = {rgb, FRAME_SIDE, FRAME_SIDE, false};
    for (int cell = 0; cell < CELLS; cell++) {
        envd_color_t color = {0, 0, 0};
        switch (s->grid[cell]) {
        case PX_FOOD: color = (envd_color_t){220, 40, 40}; break;
        case PX_BODY: color = (envd_color_t){40, 160, 60}; break;
        case PX_HEAD: color = (envd_color_t){150, 240, 120}; break;
        default: break;
        }
        double x0 = (cell % GRID) * FRAME_CELL_PX, y0 = (cell / GRID) * FRAME_CELL_PX;
        double x1 = x0 + FRAME_CELL_PX - 1, y1 = y0 + FRAME_CELL_PX - 1;
        const double quad[8] = {x0, y0, x1, y0, x1, y1, x0, y1};
        envd_raster_polygon(&r, quad, 4, color);
    }
    return ENVD_OK;
}

const envd_env_def_t envd_builtin_snake = {
    .abi_version = ENVD_ABI_VERSION,
    .id = "Snake-v0",
    .observation_space = {.kind = ENVD_SPACE_BOX, .dtype = ENVD_DTYPE_UINT8, .ndim = 2,
                          .shape = {SIDE, SIDE}, .low = obs_low, .high = obs_high},
    .action_space = {.kind = ENVD_SPACE_DISCRETE, .dtype = ENVD_DTYPE_INT64, .n = 4},
    .state_size = sizeof(snake_t),
    .num_agents = 1,
    .max_episode_steps = 1000,
    .params = NULL,
    .num_params = 0,
    .init = snake_init,
    .reset = snake_reset,
    .step = snake_step,
    .render_width = FRAME_SIDE,
    .render_height = FRAME_SIDE,
    .render_fps = 15,
    .render = snake_render,
};
