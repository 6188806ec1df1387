/* The per-row distribution transform and the inverse-CDF draw, in plain C.
 *
 * Mirrors runtime/kernels.py (the reference) step for step:
 *
 *     top-k -> top-p -> min-p (both on the T=1 softmax) -> temperature -> softmax
 *
 * Where numpy sorts the whole vocabulary, this code selects: a heap of k for top-k, and a
 * quickselect that finds the top-p nucleus without sorting it. Probabilities agree with
 * numpy to rounding (numpy's exp and rowmath.h's differ by an ulp or two, and sums are
 * grouped differently), so keep/drop decisions and sampled tokens are the same except where
 * a value lands within rounding of a boundary.
 *
 * C standard library only; no Python here (outrider_native.c is the glue).
 */
#ifndef OUTRIDER_SAMPLING_H
#define OUTRIDER_SAMPLING_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rowmath.h"

enum {
    OR_OK = 0,
    OR_ERR_NAN = -1,     /* a logit is NaN */
    OR_ERR_ALL_INF = -2, /* no finite logit at temperature > 0 */
    OR_ERR_NOMEM = -3,
};

typedef struct {
    double temperature; /* 0 = point mass on the argmax */
    int64_t top_k;      /* 0 = off */
    double top_p;       /* 1 = off */
    double min_p;       /* 0 = off */
} or_settings;

/* A candidate token and its T=1 probability; ordered by p descending, then id ascending
 * (numpy's stable argsort of -p). */
typedef struct {
    double p;
    int32_t id;
} or_pair;

static inline int or_pair_better(const or_pair *a, const or_pair *b) {
    return a->p > b->p || (a->p == b->p && a->id < b->id);
}

static int or_pair_cmp(const void *va, const void *vb) {
    const or_pair *a = (const or_pair *)va, *b = (const or_pair *)vb;
    if (a->p != b->p) return a->p > b->p ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

static inline void or_pair_swap(or_pair *a, or_pair *b) {
    or_pair t = *a;
    *a = *b;
    *b = t;
}

/* ---- top-k: a heap of the k best (logit descending, id ascending) ------------------- */

/* Heap order: the root is the *worst* kept token, so a new one only has to beat it. */
static inline int or_worse(const float *x, int32_t a, int32_t b) {
    return x[a] < x[b] || (x[a] == x[b] && a > b);
}

static void or_sift_down(int32_t *h, size_t k, size_t i, const float *x) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && or_worse(x, h[l], h[w])) w = l;
        if (r < k && or_worse(x, h[r], h[w])) w = r;
        if (w == i) return;
        int32_t t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* The k best ids of x[0..n) (any order) into h. Scanning ids upward, a later token with an
 * equal logit is worse than the root (higher id), hence the strict `>`: ties keep the lower
 * id, exactly like numpy's stable argsort. Infinities take part like any value. */
static void or_top_k(const float *x, size_t n, size_t k, int32_t *h) {
    for (size_t i = 0; i < k; i++) h[i] = (int32_t)i;
    for (size_t i = k / 2; i-- > 0;) or_sift_down(h, k, i, x);
    for (size_t i = k; i < n; i++) {
        if (x[i] > x[h[0]]) {
            h[0] = (int32_t)i;
            or_sift_down(h, k, 0, x);
        }
    }
}

/* ---- top-p: the smallest prefix (in p order) whose mass reaches top_p --------------- */

#define OR_SORT_ALL 4096 /* up to this many candidates: sort them all (numpy's exact cumsum) */
#define OR_SORT_TAIL 64  /* quickselect until this few remain, then sort those */

/* Reorders a[0..c) so that the kept tokens are a[0..cut) and returns cut. As numpy:
 * cut = 1 + the first index where the running sum reaches top_p, or c if it never does. */
static size_t or_top_p(or_pair *a, size_t c, double top_p) {
    double acc = 0.0;
    if (c <= OR_SORT_ALL) {
        qsort(a, c, sizeof *a, or_pair_cmp);
        for (size_t i = 0; i < c; i++) {
            acc += a[i].p;
            if (acc >= top_p) return i + 1;
        }
        return c;
    }
    /* Invariant: a[0..lo) are the lo best, with mass acc < top_p; the cut lies in (lo, hi]. */
    size_t lo = 0, hi = c;
    uint64_t rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)c; /* local: deterministic pivots */
    while (hi - lo > OR_SORT_TAIL) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        size_t mid = lo + (size_t)(rng % (hi - lo));
        /* median of three (lo, mid, hi-1) moved to hi-1 as the pivot */
        or_pair *A = &a[lo], *B = &a[mid], *C = &a[hi - 1];
        if (or_pair_better(A, B)) or_pair_swap(A, B); /* now B is better than A */
        if (or_pair_better(B, C)) or_pair_swap(B, C); /* C is the best of the three */
        if (or_pair_better(A, B)) or_pair_swap(A, B); /* B is the median */
        or_pair_swap(B, C);
        or_pair pivot = a[hi - 1];
        size_t s = lo;
        double mass = 0.0;
        for (size_t j = lo; j < hi - 1; j++) {
            if (or_pair_better(&a[j], &pivot)) {
                mass += a[j].p;
                or_pair_swap(&a[s], &a[j]);
                s++;
            }
        }
        or_pair_swap(&a[s], &a[hi - 1]);
        if (acc + mass >= top_p) {
            hi = s; /* the cut is among the ones better than the pivot */
        } else if (acc + mass + a[s].p >= top_p) {
            return s + 1; /* the pivot itself completes the nucleus */
        } else {
            acc += mass + a[s].p;
            lo = s + 1;
        }
    }
    qsort(a + lo, hi - lo, sizeof *a, or_pair_cmp);
    for (size_t i = lo; i < hi; i++) {
        acc += a[i].p;
        if (acc >= top_p) return i + 1;
    }
    return hi; /* only by rounding: the partition sums said the mass is reached by hi */
}

/* ---- the transform ---------------------------------------------------------------- */

static inline void or_store(double *out64, float *out32, size_t i, double v) {
    if (out64) out64[i] = v;
    else out32[i] = (float)v;
}

static inline void or_clear(double *out64, float *out32, size_t n) {
    if (out64) memset(out64, 0, n * sizeof *out64);
    else memset(out32, 0, n * sizeof *out32);
}

/* Final softmax at the temperature over the kept ids; `e` is scratch of n_keep doubles. */
static void or_final_softmax(const float *x, size_t n, const int32_t *keep, size_t n_keep,
                             double t, double *e, double *out64, float *out32) {
    double m = -INFINITY;
    for (size_t j = 0; j < n_keep; j++) {
        double y = (double)x[keep[j]] / t;
        if (y > m) m = y;
    }
    double s = 0.0;
    for (size_t j = 0; j < n_keep; j++) {
        e[j] = or_exp((double)x[keep[j]] / t - m);
        s += e[j];
    }
    or_clear(out64, out32, n);
    for (size_t j = 0; j < n_keep; j++) or_store(out64, out32, (size_t)keep[j], e[j] / s);
}

/* Writes the final sampling distribution of x[0..n) into out64 (or out32 when out64 is
 * NULL). Returns how many tokens were kept, or an OR_ERR_* code. */
static int64_t or_transform(const float *x, size_t n, const or_settings *st, double *out64,
                            float *out32) {
    size_t best = 0, n_finite = n;
    float fmax; /* largest finite logit: +inf never survives (isfinite) */
    if (or_all_finite_max(x, n, &fmax)) {
        if (st->temperature == 0.0)
            while (x[best] != fmax) best++; /* np.argmax: the first maximum */
    } else { /* a NaN or an infinity somewhere: the exact, slower scan */
        n_finite = 0;
        fmax = -INFINITY;
        for (size_t i = 0; i < n; i++) {
            float v = x[i];
            if (v != v) return OR_ERR_NAN;
            if (v > x[best]) best = i;
            if (isfinite(v)) {
                n_finite++;
                if (v > fmax) fmax = v;
            }
        }
    }
    if (st->temperature == 0.0) {
        or_clear(out64, out32, n);
        or_store(out64, out32, best, 1.0);
        return 1;
    }
    if (n_finite == 0) return OR_ERR_ALL_INF;

    const int use_top_k = st->top_k > 0 && (uint64_t)st->top_k < (uint64_t)n;
    const int need_probs = st->top_p < 1.0 || st->min_p > 0.0;
    const double t = st->temperature;

    if (!use_top_k && !need_probs) { /* plain softmax over every finite logit */
        double *e = out64 ? out64 : (double *)malloc(n * sizeof *e);
        if (!e) return OR_ERR_NOMEM;
        const double s = or_exp_row(x, n, t, (double)fmax / t, e);
        if (out64)
            for (size_t i = 0; i < n; i++) out64[i] = e[i] / s;
        else
            for (size_t i = 0; i < n; i++) out32[i] = (float)(e[i] / s);
        if (!out64) free(e);
        return (int64_t)n_finite;
    }

    /* Candidates as (T=1 probability, id) pairs. */
    size_t c = 0;
    or_pair *pairs = NULL;
    int32_t *keep = NULL;
    double *e = NULL;
    int64_t rc = OR_ERR_NOMEM;

    if (use_top_k) {
        size_t k = (size_t)st->top_k;
        keep = (int32_t *)malloc(k * sizeof *keep);
        pairs = (or_pair *)malloc(k * sizeof *pairs);
        e = (double *)malloc(k * sizeof *e);
        if (!keep || !pairs || !e) goto done;
        or_top_k(x, n, k, keep);
        double m = -INFINITY;
        for (size_t j = 0; j < k; j++) {
            float v = x[keep[j]];
            if (isfinite(v)) {
                pairs[c++].id = keep[j];
                if ((double)v > m) m = (double)v;
            }
        }
        if (need_probs) {
            double s = 0.0;
            for (size_t j = 0; j < c; j++) {
                pairs[j].p = or_exp((double)x[pairs[j].id] - m);
                s += pairs[j].p;
            }
            for (size_t j = 0; j < c; j++) pairs[j].p /= s;
        }
    } else {
        /* Dense T=1 softmax; the exponentials go through `e` (out64 itself when it can). */
        double *dense = out64 ? out64 : (double *)malloc(n * sizeof *dense);
        if (!dense) goto done;
        const double s = or_exp_row(x, n, 1.0, (double)fmax, dense);
        /* numpy: probs >= min_p * probs.max(), and probs.max() = exp(0) / s = 1 / s */
        const double thr = st->min_p > 0.0 ? st->min_p * (1.0 / s) : -1.0;
        size_t cap = st->min_p > 0.0 ? 0 : n_finite;
        if (st->min_p > 0.0) {
            for (size_t i = 0; i < n; i++) cap += dense[i] / s >= thr;
        }
        pairs = (or_pair *)malloc((cap ? cap : 1) * sizeof *pairs);
        if (!pairs) {
            if (!out64) free(dense);
            goto done;
        }
        for (size_t i = 0; i < n; i++) {
            if (!isfinite(x[i])) continue;
            double p = dense[i] / s;
            if (p >= thr) {
                pairs[c].p = p;
                pairs[c].id = (int32_t)i;
                c++;
            }
        }
        if (!out64) free(dense);
        keep = (int32_t *)malloc((c ? c : 1) * sizeof *keep);
        e = (double *)malloc((c ? c : 1) * sizeof *e);
        if (!keep || !e) goto done;
    }

    if (use_top_k && st->min_p > 0.0 && c > 0) {
        /* the best candidate has p = 1/s exactly: the max of the pairs is probs.max() */
        double pmax = 0.0;
        for (size_t j = 0; j < c; j++)
            if (pairs[j].p > pmax) pmax = pairs[j].p;
        const double thr = st->min_p * pmax;
        size_t w = 0;
        for (size_t j = 0; j < c; j++)
            if (pairs[j].p >= thr) pairs[w++] = pairs[j];
        c = w;
    }
    /* top-p and min-p masks come from the same probabilities and both keep a prefix of the
     * p order, so top-p over the min-p survivors is their intersection. */
    if (st->top_p < 1.0 && c > 0) c = or_top_p(pairs, c, st->top_p);
    if (c == 0) { /* only +inf among the top-k: numpy would return NaNs here */
        rc = OR_ERR_ALL_INF;
        goto done;
    }
    for (size_t j = 0; j < c; j++) keep[j] = pairs[j].id;
    or_final_softmax(x, n, keep, c, t, e, out64, out32);
    rc = (int64_t)c;
done:
    free(pairs);
    free(keep);
    free(e);
    return rc;
}

/* ---- inverse-CDF draw --------------------------------------------------------------- */

/* kernels.sample for float32 rows, exactly: numpy's cumsum adds sequentially in float32 and
 * multiplies u as float32 (a Python float is a "weak" scalar), and so does this. */
static size_t or_sample_f32(const float *p, size_t n, double u) {
    float total = 0;
    for (size_t i = 0; i < n; i++) total += p[i];
    float target = (float)u * total;
    size_t idx = n - 1;
    float cum = 0;
    for (size_t i = 0; i < n; i++) {
        cum += p[i];
        if (cum > target) {
            idx = i;
            break;
        }
    }
    while (p[idx] == 0 && idx > 0) idx--;
    return idx;
}

/* kernels.sample for float64 rows, a block at a time (see or_draw). */
static size_t or_sample_f64(const double *p, size_t n, double u) {
    size_t idx = or_draw(p, NULL, SIZE_MAX, n, u);
    return idx == SIZE_MAX ? 0 : idx; /* numpy lands on 0 for an all-zero row */
}

#endif /* OUTRIDER_SAMPLING_H */
