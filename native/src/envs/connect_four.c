/*
 * ConnectFour-v0: PettingZoo's connect_four_v3 for one agent (player_0, who
 * always moves first) against a built-in opponent (player_1).
 *
 * Board 6 rows x 7 columns.  Observation uint8 (6, 7, 2), exactly
 * connect_four_v3's observation["observation"] for player_0: obs[r][c][0] is
 * the agent's piece, obs[r][c][1] the opponent's, row 0 the TOP row (pieces
 * fall towards row 5).  Action Discrete(7): the column.
 *
 * step(action):
 *   - the column is full (illegal move): reward -1, terminated, board unchanged
 *     (PettingZoo's TerminateIllegalWrapper, illegal_reward=-1);
 *   - else the agent's piece drops; four in a row: +1, terminated; else a full
 *     board: 0, terminated (cannot happen: the agent makes the odd plies);
 *     else the opponent moves; four in a row: -1, terminated; else a full
 *     board (a draw): 0, terminated; else 0.
 *   - truncated is never set; there is no default time limit (a game has at
 *     most 21 agent moves).  A step after the game ended (autoreset disabled)
 *     changes nothing and returns reward 0, terminated.
 *
 * Info field "action_mask" (uint8, shape (7,)): 1 where the column is not
 * full in the current state.
 *
 * The opponent: negamax with alpha-beta pruning to `depth` plies.
 *
 *   value(P, d), from the point of view of the player to move in position
 *   P with d plies left to search, in integers (WIN = 1000):
 *     - if the previous move connected four:  -(WIN + d)
 *       (so faster wins score higher and slower losses score less badly);
 *     - else if the board is full:            0
 *     - else if d == 0:                       0   (no heuristic)
 *     - else: max over legal moves m of -value(P + m, d - 1).
 *   (So a node with d >= 1 where some legal move connects four is worth
 *   exactly WIN + d - 1, the most any move can score there; the search uses
 *   this to stop at once.)
 *   The opponent at depth D >= 1 scores each legal column m as
 *   -value(P + m, D - 1) and picks among ALL columns of the best score; at
 *   depth 0 every legal column ties (a uniformly random legal move).
 *   The pick: with k tied columns listed in increasing column order, the
 *   one at index floor(envd_rng_random(rng) * k).  Exactly one draw per
 *   opponent move (also when k == 1); nothing else draws from the RNG.
 *
 *   Root scores must be exact for every move that ties with the best, not
 *   just for the best: each root move is searched with the window
 *   (best - 1, +inf), so a move scoring >= best is exact and one scoring
 *   < best only proves it (integer scores).
 *
 * A step's cost grows about geometrically with the depth (figures per depth:
 * docs/benchmarks.md).
 *
 * Board representation: one bitboard per player, bit (7 * col + row) with
 * row 0 the BOTTOM row; row 6 of each column is an always-empty sentinel, so
 * shifts by 1 (vertical), 7 (horizontal), 6 and 8 (diagonals) never wrap.
 */
#include "envd.h"
#include "raster.h"

#define ROWS 6
#define COLS 7
#define H1 (ROWS + 1)
#define NCELLS (ROWS * COLS)
#define WIN 1000
#define SCORE_INF 1000000
#define DEPTH_MAX 10
#define DEPTH_DEFAULT 5

/* bottom cell of every column */
#define BOTTOM_ROW 0x40810204081ULL
/* the 42 playable cells */
#define BOARD_MASK (BOTTOM_ROW * ((1ULL << ROWS) - 1))

typedef struct connect_four {
    uint64_t agent; /* the agent's pieces */
    uint64_t opp;   /* the opponent's pieces */
    int32_t depth;  /* search depth of the opponent */
    bool done;      /* the episode has ended */
} connect_four_t;

static const double obs_low[NCELLS * 2] = {0};
/* filled to 1.0 by a designated range initializer (GNU C) */
static const double obs_high[NCELLS * 2] = {[0 ... NCELLS * 2 - 1] = 1.0};

static const envd_param_t params[] = {
    {"depth", ENVD_PARAM_INT, DEPTH_DEFAULT, 0, DEPTH_MAX,
     "search depth (plies) of the opponent's negamax; 0 = a uniformly random legal move"},
};

static const envd_info_field_t info_fields[] = {
    {"action_mask", ENVD_DTYPE_UINT8, 1, {COLS}, "1 for each column that is not full"},
};

/* Search order: centre columns first (better pruning; values do not depend on it). */
static const int order[COLS] = {3, 2, 4, 1, 5, 0, 6};

static inline uint64_t top_bit(int col) { return 1ULL << (col * H1 + ROWS - 1); }
static inline uint64_t bottom_bit(int col) { return 1ULL << (col * H1); }
static inline uint64_t column_bits(int col) { return ((1ULL << ROWS) - 1) << (col * H1); }

static inline bool can_play(uint64_t mask, int col) { return (mask & top_bit(col)) == 0; }

/* The cell a piece dropped into col lands on (the column must not be full). */
static inline uint64_t drop_bit(uint64_t mask, int col)
{
    return (mask + bottom_bit(col)) & column_bits(col);
}

static inline bool has_four(uint64_t b)
{
    uint64_t m;
    m = b & (b >> 1); /* vertical */
    if (m & (m >> 2))
        return true;
    m = b & (b >> H1); /* horizontal */
    if (m & (m >> (2 * H1)))
        return true;
    m = b & (b >> (H1 - 1)); /* diagonal, one way */
    if (m & (m >> (2 * (H1 - 1))))
        return true;
    m = b & (b >> (H1 + 1)); /* diagonal, the other way */
    if (m & (m >> (2 * (H1 + 1))))
        return true;
    return false;
}

static inline bool board_full(uint64_t mask) { return mask == BOARD_MASK; }

/* value(P, d) of the header comment, alpha-beta (fail-soft): exact when the
 * value lies strictly inside (alpha, beta), else a bound on the same side.
 * cur: pieces of the player to move; mask: all pieces.  Preconditions: the
 * previous move did not connect four, the board is not full, d >= 1. */
static int negamax(uint64_t cur, uint64_t mask, int d, int alpha, int beta)
{
    for (int col = 0; col < COLS; col++)
        if (can_play(mask, col) && has_four(cur | drop_bit(mask, col)))
            return WIN + d - 1;
    int best = -SCORE_INF;
    for (int i = 0; i < COLS; i++) {
        int col = order[i];
        if (!can_play(mask, col))
            continue;
        uint64_t child_mask = mask | drop_bit(mask, col);
        /* the move does not win: the child is worth 0 at d - 1 == 0 or full */
        int score = d == 1 || board_full(child_mask)
                        ? 0
                        : -negamax(cur ^ mask, child_mask, d - 1, -beta, -alpha);
        if (score > best) {
            best = score;
            if (score > alpha) {
                alpha = score;
                if (alpha >= beta)
                    break;
            }
        }
    }
    return best;
}

/* The opponent's column: cur its pieces, other the agent's. */
static int opponent_move(const connect_four_t *s, envd_rng_t *rng)
{
    uint64_t cur = s->opp, mask = s->agent | s->opp;
    int depth = s->depth;
    int score[COLS];
    bool legal[COLS];
    int best = -SCORE_INF;
    bool any_win = false;
    for (int col = 0; col < COLS; col++) {
        legal[col] = can_play(mask, col);
        score[col] = 0;
        if (depth > 0 && legal[col] && has_four(cur | drop_bit(mask, col))) {
            score[col] = WIN + depth - 1;
            any_win = true;
        }
    }
    if (depth == 0) {
        best = 0; /* all legal columns tie at 0 */
    } else if (any_win) {
        best = WIN + depth - 1;
    } else {
        for (int i = 0; i < COLS; i++) {
            int col = order[i];
            if (!legal[col])
                continue;
            uint64_t child_mask = mask | drop_bit(mask, col);
            int alpha = best == -SCORE_INF ? -SCORE_INF : best - 1;
            /* child: the agent to move, window (-inf, -alpha) */
            score[col] = depth == 1 || board_full(child_mask)
                             ? 0
                             : -negamax(cur ^ mask, child_mask, depth - 1, -SCORE_INF, -alpha);
            if (score[col] > best)
                best = score[col];
        }
    }
    int ties[COLS], k = 0;
    for (int col = 0; col < COLS; col++)
        if (legal[col] && score[col] == best)
            ties[k++] = col;
    int pick = (int)(envd_rng_random(rng) * k);
    if (pick >= k) /* cannot happen (random() < 1); keeps the index in range */
        pick = k - 1;
    return ties[pick];
}

static void write_obs(const connect_four_t *s, uint8_t *obs)
{
    for (int r = 0; r < ROWS; r++) {         /* r: PettingZoo's row, 0 = top */
        for (int c = 0; c < COLS; c++) {
            uint64_t bit = 1ULL << (c * H1 + (ROWS - 1 - r));
            obs[(r * COLS + c) * 2 + 0] = (s->agent & bit) != 0;
            obs[(r * COLS + c) * 2 + 1] = (s->opp & bit) != 0;
        }
    }
}

static int c4_init(void *state, const double *p)
{
    connect_four_t *s = state;
    if (!(p[0] >= 0 && p[0] <= DEPTH_MAX))
        return ENVD_ERANGE;
    s->depth = (int32_t)p[0];
    return ENVD_OK;
}

static int c4_reset(void *state, envd_rng_t *rng, void *obs)
{
    (void)rng;
    connect_four_t *s = state;
    s->agent = 0;
    s->opp = 0;
    s->done = false;
    write_obs(s, obs);
    return ENVD_OK;
}

static int c4_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                   double *reward, bool *terminated, bool *truncated)
{
    connect_four_t *s = state;
    int64_t col = *(const int64_t *)action;
    if (col < 0 || col >= COLS)
        return ENVD_EINVAL;
    *truncated = false;
    *reward = 0.0;
    *terminated = true;
    uint64_t mask = s->agent | s->opp;
    if (s->done) {
        /* stepping past the end: nothing changes */
    } else if (!can_play(mask, (int)col)) {
        *reward = -1.0; /* illegal move */
    } else {
        s->agent |= drop_bit(mask, (int)col);
        mask = s->agent | s->opp;
        if (has_four(s->agent)) {
            *reward = 1.0;
        } else if (!board_full(mask)) {
            s->opp |= drop_bit(mask, opponent_move(s, rng));
            mask = s->agent | s->opp;
            if (has_four(s->opp))
                *reward = -1.0;
            else if (!board_full(mask))
                *terminated = false;
        }
    }
    s->done = *terminated;
    write_obs(s, obs);
    return ENVD_OK;
}

static int c4_write_info(const void *state, void *const *fields)
{
    const connect_four_t *s = state;
    uint8_t *mask_out = fields[0];
    uint64_t mask = s->agent | s->opp;
    for (int col = 0; col < COLS; col++)
        mask_out[col] = can_play(mask, col);
    return ENVD_OK;
}

/* The frame (render_mode="rgb_array"): a blue board of 80 px cells, bottom
 * row at the bottom; the agent's discs red, the opponent's yellow. */
#define FRAME_CELL_PX 80

static int c4_render(const void *state, uint8_t *rgb)
{
    const connect_four_t *s = state;
    envd_raster_t r = {rgb, COLS * FRAME_CELL_PX, ROWS * FRAME_CELL_PX, true};
    envd_raster_fill(&r, (envd_color_t){30, 70, 200});
    for (int c = 0; c < COLS; c++)
        for (int row = 0; row < ROWS; row++) {
            uint64_t bit = 1ULL << (c * H1 + row);
            envd_color_t color = s->agent & bit ? (envd_color_t){220, 40, 40}
                                 : s->opp & bit ? (envd_color_t){240, 220, 40}
                                                : (envd_color_t){255, 255, 255};
            envd_raster_circle(&r, c * FRAME_CELL_PX + FRAME_CELL_PX / 2,
                               row * FRAME_CELL_PX + FRAME_CELL_PX / 2,
                               FRAME_CELL_PX * 0.4, color);
        }
    return ENVD_OK;
}

const envd_env_def_t envd_builtin_connect_four = {
    .abi_version = ENVD_ABI_VERSION,
    .id = "ConnectFour-v0",
    .observation_space = {.kind = ENVD_SPACE_BOX, .dtype = ENVD_DTYPE_UINT8, .ndim = 3,
                          .shape = {ROWS, COLS, 2}, .low = obs_low, .high = obs_high},
    .action_space = {.kind = ENVD_SPACE_DISCRETE, .dtype = ENVD_DTYPE_INT64, .n = COLS},
    .state_size = sizeof(connect_four_t),
    .num_agents = 1,
    .max_episode_steps = 0,
    .params = params,
    .num_params = 1,
    .init = c4_init,
    .reset = c4_reset,
    .step = c4_step,
    .render_width = COLS * FRAME_CELL_PX,
    .render_height = ROWS * FRAME_CELL_PX,
    .render_fps = 2,
    .render = c4_render,
    .info_fields = info_fields,
    .num_info_fields = 1,
    .write_info = c4_write_info,
};
