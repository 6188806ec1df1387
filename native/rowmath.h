/* Whole-row loops of the transform: exp, sums, the finite/max scan.
 *
 * These run over every token of the vocabulary (49k-256k), so they must use the vector
 * unit. SSE2 is in every x86-64 CPU; elsewhere a portable loop computes the very same
 * operations in the same order, so both paths give bit-identical results.
 *
 * or_exp: exp(y) for y <= 0 to within 2 ulp (Cody-Waite reduction by ln 2, the Taylor
 * polynomial of degree 13 — truncation error 4e-18 on |r| <= ln2/2 — then scaling by 2^k in
 * two halves so that results down to the smallest subnormal come out right).
 */
#ifndef OUTRIDER_ROWMATH_H
#define OUTRIDER_ROWMATH_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifndef OR_HAVE_SSE2 /* -DOR_HAVE_SSE2=0 builds the portable path, to compare the two */
#if defined(__SSE2__) || defined(_M_X64)
#define OR_HAVE_SSE2 1
#else
#define OR_HAVE_SSE2 0
#endif
#endif
#if OR_HAVE_SSE2
#include <emmintrin.h>
#endif

#define OR_MAGIC 6755399441055744.0 /* 1.5 * 2^52: adding it rounds a double to an integer */
#define OR_LOG2E 1.4426950408889634
#define OR_LN2_HI 6.93147180369123816490e-01 /* ln 2 split so kd * OR_LN2_HI is exact */
#define OR_LN2_LO 1.90821492927058770002e-10
#define OR_EXP_FLOOR (-746.0) /* exp of anything below rounds to 0 */

static inline double or_bits_to_double(int64_t b) {
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

static inline int64_t or_double_to_bits(double d) {
    int64_t b;
    memcpy(&b, &d, sizeof b);
    return b;
}

/* The polynomial in Estrin's form: a short dependency chain, so that neighbouring elements
 * overlap in the pipeline (Horner's 13 dependent steps made the row loop latency-bound). */
#define OR_EXP_POLY(MUL, ADD, SET, r)                                                       \
    do {                                                                                    \
        r2 = MUL(r, r);                                                                     \
        r4 = MUL(r2, r2);                                                                   \
        r8 = MUL(r4, r4);                                                                   \
        c0 = ADD(SET(1.0), r);                                                              \
        c1 = ADD(SET(1.0 / 2.0), MUL(r, SET(1.0 / 6.0)));                                   \
        c2 = ADD(SET(1.0 / 24.0), MUL(r, SET(1.0 / 120.0)));                                \
        c3 = ADD(SET(1.0 / 720.0), MUL(r, SET(1.0 / 5040.0)));                              \
        c4 = ADD(SET(1.0 / 40320.0), MUL(r, SET(1.0 / 362880.0)));                         \
        c5 = ADD(SET(1.0 / 3628800.0), MUL(r, SET(1.0 / 39916800.0)));                      \
        c6 = ADD(SET(1.0 / 479001600.0), MUL(r, SET(1.0 / 6227020800.0)));                  \
        d0 = ADD(c0, MUL(r2, c1));                                                          \
        d1 = ADD(c2, MUL(r2, c3));                                                          \
        d2 = ADD(c4, MUL(r2, c5));                                                          \
        e0 = ADD(d0, MUL(r4, d1));                                                          \
        e1 = ADD(d2, MUL(r4, c6));                                                          \
        poly = ADD(e0, MUL(r8, e1));                                                        \
    } while (0)

#define OR_SMUL(a, b) ((a) * (b))
#define OR_SADD(a, b) ((a) + (b))
#define OR_SSET(a) (a)

static inline double or_exp(double y) {
    y = y > OR_EXP_FLOOR ? y : OR_EXP_FLOOR; /* also maps NaN to the floor, as maxpd does */
    double kd = (y * OR_LOG2E + OR_MAGIC) - OR_MAGIC;
    double r = (y - kd * OR_LN2_HI) - kd * OR_LN2_LO;
    double r2, r4, r8, c0, c1, c2, c3, c4, c5, c6, d0, d1, d2, e0, e1, poly;
    OR_EXP_POLY(OR_SMUL, OR_SADD, OR_SSET, r);
    /* 2^k = 2^k1 * 2^k2 with k1 = round(k / 2): each factor stays a normal double */
    double k1f = kd * 0.5 + OR_MAGIC;
    double k2f = (kd - (k1f - OR_MAGIC)) + OR_MAGIC;
    const int64_t offset = or_double_to_bits(OR_MAGIC) - 1023;
    double s1 = or_bits_to_double((int64_t)((uint64_t)(or_double_to_bits(k1f) - offset) << 52));
    double s2 = or_bits_to_double((int64_t)((uint64_t)(or_double_to_bits(k2f) - offset) << 52));
    return poly * s1 * s2;
}

#if OR_HAVE_SSE2
static inline __m128d or_exp_sse2(__m128d y) {
    const __m128d magic = _mm_set1_pd(OR_MAGIC);
    y = _mm_max_pd(y, _mm_set1_pd(OR_EXP_FLOOR));
    __m128d kd = _mm_sub_pd(_mm_add_pd(_mm_mul_pd(y, _mm_set1_pd(OR_LOG2E)), magic), magic);
    __m128d r = _mm_sub_pd(_mm_sub_pd(y, _mm_mul_pd(kd, _mm_set1_pd(OR_LN2_HI))),
                           _mm_mul_pd(kd, _mm_set1_pd(OR_LN2_LO)));
    __m128d r2, r4, r8, c0, c1, c2, c3, c4, c5, c6, d0, d1, d2, e0, e1, poly;
    OR_EXP_POLY(_mm_mul_pd, _mm_add_pd, _mm_set1_pd, r);
    __m128d k1f = _mm_add_pd(_mm_mul_pd(kd, _mm_set1_pd(0.5)), magic);
    __m128d k2f = _mm_add_pd(_mm_sub_pd(kd, _mm_sub_pd(k1f, magic)), magic);
    const __m128i offset = _mm_set1_epi64x(or_double_to_bits(OR_MAGIC) - 1023);
    __m128i b1 = _mm_slli_epi64(_mm_sub_epi64(_mm_castpd_si128(k1f), offset), 52);
    __m128i b2 = _mm_slli_epi64(_mm_sub_epi64(_mm_castpd_si128(k2f), offset), 52);
    return _mm_mul_pd(_mm_mul_pd(poly, _mm_castsi128_pd(b1)), _mm_castsi128_pd(b2));
}

/* exp of (x[i..i+4) / t - m) as two vectors, 0 where x is not finite */
static inline void or_exp4_sse2(const float *x, double t, double m, double *e) {
    const __m128 absmask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    __m128 v = _mm_loadu_ps(x);
    __m128 fin = _mm_cmple_ps(_mm_and_ps(v, absmask), _mm_set1_ps(FLT_MAX));
    __m128d lo = _mm_cvtps_pd(v), hi = _mm_cvtps_pd(_mm_movehl_ps(v, v));
    if (t != 1.0) { /* x / 1 == x: skip the division at T = 1 */
        lo = _mm_div_pd(lo, _mm_set1_pd(t));
        hi = _mm_div_pd(hi, _mm_set1_pd(t));
    }
    __m128d elo = or_exp_sse2(_mm_sub_pd(lo, _mm_set1_pd(m)));
    __m128d ehi = or_exp_sse2(_mm_sub_pd(hi, _mm_set1_pd(m)));
    __m128i fi = _mm_castps_si128(fin); /* widen the 32-bit lane masks to 64 bits */
    _mm_storeu_pd(e, _mm_and_pd(elo, _mm_castsi128_pd(_mm_unpacklo_epi32(fi, fi))));
    _mm_storeu_pd(e + 2, _mm_and_pd(ehi, _mm_castsi128_pd(_mm_unpackhi_epi32(fi, fi))));
}
#endif

#if OR_HAVE_SSE2 && defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
/* The same operations four lanes wide where the CPU has AVX2 (chosen at run time; no FMA,
 * so every path rounds alike and the results stay bit-identical). */
#include <immintrin.h>
#define OR_HAVE_AVX2_PATH 1

#define OR_AVX_ATTR __attribute__((target("avx2")))

OR_AVX_ATTR static inline __m256d or_exp_avx2(__m256d y) {
    const __m256d magic = _mm256_set1_pd(OR_MAGIC);
    y = _mm256_max_pd(y, _mm256_set1_pd(OR_EXP_FLOOR));
    __m256d kd = _mm256_sub_pd(_mm256_add_pd(_mm256_mul_pd(y, _mm256_set1_pd(OR_LOG2E)), magic),
                               magic);
    __m256d r = _mm256_sub_pd(_mm256_sub_pd(y, _mm256_mul_pd(kd, _mm256_set1_pd(OR_LN2_HI))),
                              _mm256_mul_pd(kd, _mm256_set1_pd(OR_LN2_LO)));
    __m256d r2, r4, r8, c0, c1, c2, c3, c4, c5, c6, d0, d1, d2, e0, e1, poly;
    OR_EXP_POLY(_mm256_mul_pd, _mm256_add_pd, _mm256_set1_pd, r);
    __m256d k1f = _mm256_add_pd(_mm256_mul_pd(kd, _mm256_set1_pd(0.5)), magic);
    __m256d k2f = _mm256_add_pd(_mm256_sub_pd(kd, _mm256_sub_pd(k1f, magic)), magic);
    const __m256i offset = _mm256_set1_epi64x(or_double_to_bits(OR_MAGIC) - 1023);
    __m256i b1 = _mm256_slli_epi64(_mm256_sub_epi64(_mm256_castpd_si256(k1f), offset), 52);
    __m256i b2 = _mm256_slli_epi64(_mm256_sub_epi64(_mm256_castpd_si256(k2f), offset), 52);
    return _mm256_mul_pd(_mm256_mul_pd(poly, _mm256_castsi256_pd(b1)), _mm256_castsi256_pd(b2));
}

/* or_exp_row's main loop over [0, n8), n8 a multiple of 8; lane sums as the SSE2 path's */
OR_AVX_ATTR static void or_exp_row_avx2(const float *x, size_t n8, double t, double m,
                                        double *e, double lanes[4]) {
    const __m128 absmask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    const __m256d vt = _mm256_set1_pd(t), vm = _mm256_set1_pd(m);
    __m256d acc = _mm256_setzero_pd();
    for (size_t i = 0; i < n8; i += 4) {
        __m128 v = _mm_loadu_ps(x + i);
        __m128 fin = _mm_cmple_ps(_mm_and_ps(v, absmask), _mm_set1_ps(FLT_MAX));
        __m256d y = _mm256_cvtps_pd(v);
        if (t != 1.0) y = _mm256_div_pd(y, vt);
        __m256d ev = or_exp_avx2(_mm256_sub_pd(y, vm));
        __m256d mask = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm_castps_si128(fin)));
        ev = _mm256_and_pd(ev, mask);
        _mm256_storeu_pd(e + i, ev);
        acc = _mm256_add_pd(acc, ev);
    }
    _mm256_storeu_pd(lanes, acc);
}
#else
#define OR_HAVE_AVX2_PATH 0
#endif

/* e[i] = exp(x[i] / t - m) for finite x[i], else 0; returns the sum of e. The sum keeps
 * four partial sums by i mod 4 on both paths, so the result is the same bits either way. */
static double or_exp_row(const float *x, size_t n, double t, double m, double *e) {
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0, tail = 0.0;
    size_t i = 0;
#if OR_HAVE_AVX2_PATH
    if (__builtin_cpu_supports("avx2")) {
        double lanes[4];
        i = n - n % 8;
        or_exp_row_avx2(x, i, t, m, e, lanes);
        s0 = lanes[0];
        s1 = lanes[1];
        s2 = lanes[2];
        s3 = lanes[3];
        goto tail;
    }
#endif
#if OR_HAVE_SSE2
    __m128d acc_lo = _mm_setzero_pd(), acc_hi = _mm_setzero_pd();
    for (; i + 8 <= n; i += 8) {
        or_exp4_sse2(x + i, t, m, e + i);
        or_exp4_sse2(x + i + 4, t, m, e + i + 4);
        acc_lo = _mm_add_pd(acc_lo, _mm_loadu_pd(e + i));
        acc_hi = _mm_add_pd(acc_hi, _mm_loadu_pd(e + i + 2));
        acc_lo = _mm_add_pd(acc_lo, _mm_loadu_pd(e + i + 4));
        acc_hi = _mm_add_pd(acc_hi, _mm_loadu_pd(e + i + 6));
    }
    double lanes[4];
    _mm_storeu_pd(lanes, acc_lo);
    _mm_storeu_pd(lanes + 2, acc_hi);
    s0 = lanes[0];
    s1 = lanes[1];
    s2 = lanes[2];
    s3 = lanes[3];
#else
    for (; i + 8 <= n; i += 8) {
        for (size_t j = 0; j < 8; j++) {
            double y = (double)x[i + j];
            if (t != 1.0) y /= t;
            double v = or_exp(y - m);
            e[i + j] = fabsf(x[i + j]) <= FLT_MAX ? v : 0.0;
        }
        s0 += e[i];
        s1 += e[i + 1];
        s2 += e[i + 2];
        s3 += e[i + 3];
        s0 += e[i + 4];
        s1 += e[i + 5];
        s2 += e[i + 6];
        s3 += e[i + 7];
    }
#endif
#if OR_HAVE_AVX2_PATH
tail:
#endif
    for (; i < n; i++) {
        double y = (double)x[i];
        if (t != 1.0) y /= t;
        double v = or_exp(y - m);
        e[i] = fabsf(x[i]) <= FLT_MAX ? v : 0.0;
        tail += e[i];
    }
    return ((s0 + s1) + (s2 + s3)) + tail;
}

/* Sum with 8 running partial sums (vectorises without -ffast-math; more accurate than one). */
static double or_sum(const double *a, size_t n) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (size_t j = 0; j < 8; j++) acc[j] += a[i + j];
    double tail = 0.0;
    for (; i < n; i++) tail += a[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) +
           tail;
}

/* Sum of the residual r_j = max(0, p_j - q_j) over [lo, hi); without q, r = p except 0 at
 * `skip` (a point-mass draft). Same lanes and order every time it is called. */
static double or_residual_sum(const double *p, const double *q, size_t skip, size_t lo,
                              size_t hi) {
    if (!q) {
        if (skip >= lo && skip < hi)
            return or_sum(p + lo, skip - lo) + or_sum(p + skip + 1, hi - skip - 1);
        return or_sum(p + lo, hi - lo);
    }
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = lo;
    for (; i + 8 <= hi; i += 8)
        for (size_t j = 0; j < 8; j++) {
            double r = p[i + j] - q[i + j];
            acc[j] += r > 0.0 ? r : 0.0;
        }
    double tail = 0.0;
    for (; i < hi; i++) {
        double r = p[i] - q[i];
        tail += r > 0.0 ? r : 0.0;
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) +
           tail;
}

static inline double or_residual_at(const double *p, const double *q, size_t skip, size_t j) {
    if (!q) return j == skip ? 0.0 : p[j];
    double r = p[j] - q[j];
    return r > 0.0 ? r : 0.0;
}

#define OR_BLOCK 512

/* Inverse-CDF draw from the residual (see or_residual_sum; q NULL and skip = SIZE_MAX is p
 * itself): the first index whose running sum exceeds u * total, found a block at a time,
 * then backed off any zero. Returns SIZE_MAX when the residual has no mass.
 *
 * numpy (kernels.sample) adds sequentially, which is latency-bound; these block sums round
 * differently, so a draw can differ only when u * total lands within rounding of a bound. */
static size_t or_draw(const double *p, const double *q, size_t skip, size_t n, double u) {
    double total = 0.0;
    for (size_t lo = 0; lo < n; lo += OR_BLOCK)
        total += or_residual_sum(p, q, skip, lo, lo + OR_BLOCK < n ? lo + OR_BLOCK : n);
    if (!(total > 0.0)) return SIZE_MAX;
    const double target = u * total;
    double acc = 0.0;
    size_t idx = n - 1;
    for (size_t lo = 0; lo < n; lo += OR_BLOCK) {
        size_t hi = lo + OR_BLOCK < n ? lo + OR_BLOCK : n;
        double block = or_residual_sum(p, q, skip, lo, hi);
        if (acc + block > target) {
            double cum = acc;
            for (size_t j = lo; j < hi; j++) {
                cum += or_residual_at(p, q, skip, j);
                if (cum > target) {
                    idx = j;
                    goto found;
                }
            }
        }
        acc += block;
    }
found:
    while (idx > 0 && !(or_residual_at(p, q, skip, idx) > 0.0)) idx--;
    return idx;
}

/* One pass: is every logit finite, and the largest. Vectorised lanes; `v * 0` is 0 for a
 * finite v and NaN for inf or NaN, so one sum tells whether the slow exact scan is needed. */
static int or_all_finite_max(const float *x, size_t n, float *max_out) {
    float zz = 0.0f, mm = -INFINITY;
    size_t i = 0;
#if OR_HAVE_SSE2
    const __m128 zero = _mm_setzero_ps();
    __m128 z0 = zero, z1 = zero, m0 = _mm_set1_ps(-INFINITY), m1 = m0;
    for (; i + 8 <= n; i += 8) {
        __m128 a = _mm_loadu_ps(x + i), b = _mm_loadu_ps(x + i + 4);
        z0 = _mm_add_ps(z0, _mm_mul_ps(a, zero));
        z1 = _mm_add_ps(z1, _mm_mul_ps(b, zero));
        m0 = _mm_max_ps(a, m0); /* a > m ? a : m */
        m1 = _mm_max_ps(b, m1);
    }
    float zl[4], ml[4];
    _mm_storeu_ps(zl, _mm_add_ps(z0, z1));
    _mm_storeu_ps(ml, _mm_max_ps(m0, m1));
    for (int j = 0; j < 4; j++) {
        zz += zl[j];
        mm = ml[j] > mm ? ml[j] : mm;
    }
#endif
    for (; i < n; i++) {
        zz += x[i] * 0.0f;
        mm = x[i] > mm ? x[i] : mm;
    }
    *max_out = mm;
    return zz == 0.0f; /* NaN when any logit is NaN or infinite */
}

#endif /* OUTRIDER_ROWMATH_H */
