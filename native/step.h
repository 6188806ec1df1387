/* The per-step decode path in plain C: fill one llama_batch for every decoding sequence,
 * llama_decode, read the logits rows, sample (sampling.h) or verify a speculative round
 * (verify.h's rules, with p computed row by row as it is needed), and run a draft model's
 * round of k steps. runtime/engine/native_step.py is the Python face; the pure-Python
 * scheduler path (runtime/engine/scheduler.py with runtime/sampling/) is the reference.
 *
 * No llama.cpp header is needed: the two structs llama.cpp and numpy share with us are
 * declared here as they are laid out in llama.h and numpy/random/bitgen.h, and every
 * llama.cpp function is a pointer the caller resolved from the libllama already loaded
 * (ctypes.cast(llama_cpp.llama_decode, c_void_p).value), so one build of this module works
 * with CPU, CUDA and Metal wheels of llama-cpp-python.
 *
 * A worked round (greedy, k = 2): the batch holds t x1 x2 at positions n..n+2 with logits
 * on all three; argmax of row 0 is x1 (accepted), of row 1 is y != x2 (rejected): out =
 * [x1, y], accepted = 1, and row 2 is never read.
 *
 * C standard library only; no Python here (stepper.c is the glue).
 */
#ifndef OUTRIDER_STEP_H
#define OUTRIDER_STEP_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "sampling.h"
#include "verify.h"

/* struct llama_batch (llama.h): every token belongs to one sequence here. */
typedef struct {
    int32_t n_tokens;
    int32_t *token;
    float *embd;
    int32_t *pos;
    int32_t *n_seq_id;
    int32_t **seq_id;
    int8_t *logits;
} or_llama_batch;

/* int32_t llama_decode(struct llama_context * ctx, struct llama_batch batch); */
typedef int32_t (*or_decode_fn)(void *ctx, or_llama_batch batch);
/* float * llama_get_logits(struct llama_context * ctx);  (waits for the device) */
typedef float *(*or_get_logits_fn)(void *ctx);

/* numpy's bitgen_t (numpy/random/bitgen.h): Generator.random() is next_double(state), so
 * drawing here consumes a sequence's stream exactly as Sampler.uniform() does. */
typedef struct {
    void *state;
    uint64_t (*next_uint64)(void *st);
    uint32_t (*next_uint32)(void *st);
    double (*next_double)(void *st);
    uint64_t (*next_raw)(void *st);
} or_bitgen;

enum { OR_STEP_GREEDY = 0, OR_STEP_LEVIATHAN = 1, OR_STEP_GREEDY_MATCH = 2 };

enum {
    OR_ERR_INVALID = -20,    /* a NaN or +inf logit: Sampler raises InvalidLogits */
    OR_ERR_CONSTRAINT = -30, /* a mask left no finite logit: Sampler's ConstraintError */
};

/* One sequence's sampling: the mode of its verify rounds (greedy at temperature 0), the
 * transform settings and its generator (NULL at temperature 0: nothing is drawn). */
typedef struct {
    int mode;
    or_settings st;
    or_bitgen *rng;
} or_seq_cfg;

/* Seconds spent in the decode (wall and the thread's CPU) and in sampling (wall: it is
 * short and on the CPU throughout), kept only while `on`: reading a thread's CPU clock is a
 * system call (~1 us), too dear for every step of a run that is not profiled. */
typedef struct {
    int on;
    double decode_wall, decode_cpu, sample_wall;
    int64_t n_decode;
} or_step_clock;

static inline double or_now(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The readings at the start of a timed part (wall; CPU too when `cpu`); zeros while off. */
typedef struct {
    double wall, cpu;
} or_tick;

static inline or_tick or_tick_start(const or_step_clock *c, int cpu) {
    or_tick t = {0.0, 0.0};
    if (c->on) {
        t.wall = or_now(CLOCK_MONOTONIC);
        if (cpu) t.cpu = or_now(CLOCK_THREAD_CPUTIME_ID);
    }
    return t;
}

static inline void or_tick_add(const or_step_clock *c, or_tick t, double *wall, double *cpu) {
    if (c->on) {
        *wall += or_now(CLOCK_MONOTONIC) - t.wall;
        if (cpu) *cpu += or_now(CLOCK_THREAD_CPUTIME_ID) - t.cpu;
    }
}

/* ---- one row ----------------------------------------------------------------------- */

/* Sampler.sample at temperature 0: numpy's argmax (the first maximum), refused where the
 * pick is NaN or +inf (numpy's argmax lands on the first NaN). An all -inf row gives 0. */
static int64_t or_argmax_checked(const float *x, size_t n) {
    float m;
    size_t best = 0;
    if (or_all_finite_max(x, n, &m)) {
        while (x[best] != m) best++;
        return (int64_t)best;
    }
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        if (v != v) return OR_ERR_INVALID;
        if (v > x[best]) best = i;
    }
    return x[best] == INFINITY ? OR_ERR_INVALID : (int64_t)best;
}

/* The checks Sampler makes on a row's maximum before the transform (NaN, +inf). */
static int or_row_invalid(const float *x, size_t n) {
    float m;
    if (or_all_finite_max(x, n, &m)) return 0;
    for (size_t i = 0; i < n; i++)
        if (x[i] != x[i] || x[i] == INFINITY) return 1;
    return 0;
}

/* The final distribution p of one row under `c` into out (n doubles). */
static int64_t or_distribution(const float *x, size_t n, const or_seq_cfg *c, double *out) {
    if (or_row_invalid(x, n)) return OR_ERR_INVALID;
    int64_t rc = or_transform(x, n, &c->st, out, NULL);
    return rc < 0 ? rc : 0;
}

/* Sampler.sample on one row: a token id, or an OR_ERR_* code. */
static int64_t or_sample_row(const float *x, size_t n, const or_seq_cfg *c, double *scratch) {
    if (c->mode == OR_STEP_GREEDY) return or_argmax_checked(x, n);
    int64_t rc = or_distribution(x, n, c, scratch);
    if (rc < 0) return rc;
    return (int64_t)or_sample_f64(scratch, n, c->rng->next_double(c->rng->state));
}

/* ---- one row under a constraint's mask --------------------------------------------- */

/* A grammar's mask at one position as TokenMask keeps it (runtime/sampling/token_mask.py):
 * the short list of its tokens, ascending — the allowed ones (`allows`) or the refused
 * ones — and the grammar's vocabulary size, past which every token is refused. */
typedef struct {
    int allows;
    const int64_t *ids;
    size_t n_ids;
    size_t limit;
} or_mask;

/* The logits of the tokens `mk` allows, in id order, from x[0..n) into `row` (n floats);
 * returns how many. Sampler.prepared gathers an allowed list the same way; a refused list
 * it applies as -inf in a copy of the row, which has the same distribution (ties by id
 * alike) but sends every whole-row pass of the transform down its slow, scalar path for
 * non-finite rows (~250 us a token at 49k), so here the allowed runs between the refused
 * ids are copied instead. Ids past the row or the grammar's vocabulary are dropped. */
static size_t or_apply_mask(const float *x, size_t n, const or_mask *mk, float *row) {
    size_t m = 0;
    if (mk->allows) {
        for (size_t j = 0; j < mk->n_ids; j++) {
            uint64_t t = (uint64_t)mk->ids[j];
            if (t >= n) break; /* ascending: the rest lie past the row too */
            row[m++] = x[t];
        }
        return m;
    }
    const size_t end = mk->limit < n ? mk->limit : n;
    size_t from = 0;
    for (size_t j = 0; j < mk->n_ids; j++) {
        uint64_t t = (uint64_t)mk->ids[j];
        if (t >= end) break;
        if (t < from) continue; /* a repeated id */
        memcpy(row + m, x + from, (t - from) * sizeof *row);
        m += t - from;
        from = t + 1;
    }
    memcpy(row + m, x + from, (end - from) * sizeof *row);
    return m + (end - from);
}

/* The token id of position k of or_apply_mask's row. */
static int64_t or_unmask(const or_mask *mk, int64_t k) {
    if (mk->allows) return mk->ids[k];
    uint64_t id = (uint64_t)k, last = UINT64_MAX;
    for (size_t j = 0; j < mk->n_ids; j++) { /* every refused id at or below it pushes it up */
        uint64_t t = (uint64_t)mk->ids[j];
        if (t > id) break;
        if (t != last) id++;
        last = t;
    }
    return (int64_t)id;
}

/* Sampler._check_top on a masked row: NaN or +inf is OR_ERR_INVALID (the row's maximum
 * would be NaN or +inf), no finite logit left (an empty row included) is
 * OR_ERR_CONSTRAINT; 0 when the row can be sampled. */
static int64_t or_masked_check(const float *x, size_t m) {
    float top;
    if (m && or_all_finite_max(x, m, &top)) return 0;
    int finite = 0;
    for (size_t i = 0; i < m; i++) {
        float v = x[i];
        if (v != v || v == INFINITY) return OR_ERR_INVALID;
        finite |= v != -INFINITY;
    }
    return finite ? 0 : OR_ERR_CONSTRAINT;
}

/* Sampler.sample on one row under a mask: mask first, then the same checks, transform and
 * draw as an unmasked row on what is left (`row`: scratch of n floats). A token id, or an
 * OR_ERR_* code; the uniform is drawn only when the row can be sampled, as in Python. */
static int64_t or_sample_masked(const float *x, size_t n, const or_mask *mk,
                                const or_seq_cfg *c, float *row, double *scratch) {
    const size_t m = or_apply_mask(x, n, mk, row);
    int64_t k = or_masked_check(row, m);
    if (k < 0) return k;
    if (c->mode == OR_STEP_GREEDY) {
        k = or_argmax_checked(row, m); /* never an error after the check */
    } else {
        k = or_distribution(row, m, c, scratch);
        if (k < 0) return k;
        k = (int64_t)or_sample_f64(scratch, m, c->rng->next_double(c->rng->state));
    }
    return or_unmask(mk, k);
}

/* ---- a speculative round ----------------------------------------------------------- */

/* SamplingVerifier.verify on the target's k + 1 rows (rows[i * n ...]): drafts x[0..k),
 * the draft's q rows (k of width nq, or NULL: point masses), out[0..accepted] as verify.h.
 * p_i is computed only when row i is reached (the rows after a rejection are never read).
 * Above temperature 0 the k + 1 uniforms are drawn first, as the Python verifier does.
 * `p` and `qpad` are scratch rows of n doubles. Returns accepted, or an OR_ERR_* code. */
static int64_t or_verify_rows(const float *rows, size_t n, const int32_t *x, size_t k,
                              const double *q, size_t nq, const or_seq_cfg *c, double *p,
                              double *qpad, double *u, int32_t *out) {
    if (c->mode == OR_STEP_GREEDY) {
        for (size_t i = 0; i <= k; i++) {
            int64_t a = or_argmax_checked(rows + i * n, n);
            if (a < 0) return a;
            out[i] = (int32_t)a;
            if (i < k && a != x[i]) return (int64_t)i;
        }
        return (int64_t)k;
    }
    for (size_t i = 0; i <= k; i++) u[i] = c->rng->next_double(c->rng->state);
    for (size_t i = 0; i < k; i++) {
        int64_t rc = or_distribution(rows + i * n, n, c, p);
        if (rc < 0) return rc;
        const size_t xi = (size_t)x[i];
        if (c->mode == OR_STEP_GREEDY_MATCH) {
            size_t y = or_sample_f64(p, n, u[i]);
            if (y != xi) {
                out[i] = (int32_t)y;
                return (int64_t)i;
            }
            out[i] = x[i];
            continue;
        }
        const double *qi = NULL;
        double ratio = xi < n ? p[xi] : 0.0;
        if (q) {
            qi = q + i * nq;
            double qx = xi < nq ? qi[xi] : 0.0;
            if (!(qx > 0.0)) return OR_ERR_ZERO_Q;
            ratio /= qx;
            if (nq != n) { /* the draft's vocabulary is another size: q as wide as p */
                size_t m = nq < n ? nq : n;
                memcpy(qpad, qi, m * sizeof *qpad);
                if (m < n) memset(qpad + m, 0, (n - m) * sizeof *qpad);
                qi = qpad;
            }
        }
        if (ratio > 1.0) ratio = 1.0;
        if (!(u[i] < ratio)) {
            out[i] = (int32_t)or_residual_f64(p, qi, xi, n, u[k]);
            return (int64_t)i;
        }
        out[i] = x[i];
    }
    int64_t rc = or_distribution(rows + k * n, n, c, p);
    if (rc < 0) return rc;
    out[k] = (int32_t)or_sample_f64(p, n, u[k]);
    return (int64_t)k;
}

/* ---- a draft model's round --------------------------------------------------------- */

/* 1 / sum(exp(l - max)): the top probability of the T = 1 softmax (0 for no finite max). */
static double or_top_probability(const float *x, size_t n) {
    float m;
    if (!or_all_finite_max(x, n, &m)) {
        m = -INFINITY;
        for (size_t i = 0; i < n; i++)
            if (x[i] > m) m = x[i];
    }
    if (!isfinite(m)) return 0.0;
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += or_exp((double)x[i] - (double)m);
    return 1.0 / s;
}

static size_t or_argmax_f64_first(const double *p, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (p[i] > p[best]) best = i;
    return best;
}

/* ---- the decoder: one llama context and its batch --------------------------------- */

typedef struct {
    void *ctx;
    or_decode_fn decode;
    or_get_logits_fn get_logits;
    int32_t capacity;
    int32_t *token, *pos, *n_seq_id, *seq_id;
    int32_t **seq_ptr;
    int8_t *logits;
    or_step_clock *clock; /* where the timings go (the stepper's) */
} or_decoder;

/* Decode the first n_tokens of the batch; on success *rows is the logits of the outputs in
 * batch order. Timed (wall and thread CPU), llama_get_logits included: on a GPU that is
 * where the host waits for the device. Returns llama_decode's code. */
static int32_t or_decoder_run(or_decoder *d, int32_t n_tokens, float **rows) {
    or_llama_batch b = {n_tokens, d->token, NULL, d->pos, d->n_seq_id, d->seq_ptr, d->logits};
    or_tick t = or_tick_start(d->clock, 1);
    int32_t rc = d->decode(d->ctx, b);
    *rows = rc == 0 ? d->get_logits(d->ctx) : NULL;
    or_tick_add(d->clock, t, &d->clock->decode_wall, &d->clock->decode_cpu);
    d->clock->n_decode++;
    if (rc == 0 && !*rows) rc = -100; /* no logits: never after a decode that asked for them */
    return rc;
}

static inline void or_decoder_put(or_decoder *d, int32_t i, int32_t token, int32_t pos,
                                  int32_t seq, int8_t logits) {
    d->token[i] = token;
    d->pos[i] = pos;
    d->seq_id[i] = seq;
    d->logits[i] = logits;
}

/* DraftModel._draft: first decode `feed` (n_feed tokens the draft has not seen, at pos..;
 * none: start from the last decode's logits, row 0), then from the logits after them draft
 * up to k tokens into out, decoding each but the last into `slot` at the next positions.
 * Stops early when the draft's top probability is below p_min, after an end-of-generation
 * token (`stop`, NULL: never) or when a decode fails (*rc). Above temperature 0 q_out
 * receives each token's distribution (k rows of n) and each token is drawn from it with one
 * uniform (the argmax when greedy_draft). *n_eval: tokens decoded into the slot, feed
 * included. Returns how many were drafted, or an OR_ERR_* code. */
static int64_t or_draft_round(or_decoder *d, size_t n, int32_t slot, int32_t pos,
                              const int32_t *feed, size_t n_feed, size_t k,
                              const or_seq_cfg *c, int greedy_draft, double p_min,
                              const uint8_t *stop, double *q_out, int32_t *out,
                              size_t *n_eval, int32_t *rc) {
    float *rows = NULL;
    size_t m = 0;
    *n_eval = 0;
    *rc = 0;
    if (n_feed) {
        for (size_t i = 0; i < n_feed; i++)
            or_decoder_put(d, (int32_t)i, feed[i], pos + (int32_t)i, slot, i + 1 == n_feed);
        *rc = or_decoder_run(d, (int32_t)n_feed, &rows);
        if (*rc != 0) return 0;
        *n_eval = n_feed;
        pos += (int32_t)n_feed;
    } else {
        rows = d->get_logits(d->ctx);
    }
    if (!rows) return 0;
    const float *x = rows;
    for (size_t i = 0; i < k; i++) {
        or_tick tick = or_tick_start(d->clock, 0);
        int64_t t;
        double top;
        if (c->mode == OR_STEP_GREEDY) {
            t = or_argmax_checked(x, n);
            top = t >= 0 && p_min > 0.0 ? or_top_probability(x, n) : 1.0;
        } else {
            double *q = q_out + i * n;
            t = or_distribution(x, n, c, q);
            if (t >= 0) {
                double u = greedy_draft ? 0.0 : c->rng->next_double(c->rng->state);
                t = (int64_t)(greedy_draft ? or_argmax_f64_first(q, n) : or_sample_f64(q, n, u));
                top = q[or_argmax_f64_first(q, n)];
            } else {
                top = 0.0;
            }
        }
        or_tick_add(d->clock, tick, &d->clock->sample_wall, NULL);
        if (t < 0) return t;
        if (!(top >= p_min)) break;
        out[m++] = (int32_t)t;
        if (i == k - 1 || (stop && stop[t])) break;
        or_decoder_put(d, 0, (int32_t)t, pos + (int32_t)i, slot, 1);
        *rc = or_decoder_run(d, 1, &rows);
        if (*rc != 0) break;
        (*n_eval)++;
        x = rows;
    }
    return (int64_t)m;
}

#endif /* OUTRIDER_STEP_H */
