/* What the paged attention kernels share of their AVX512-BF16 path: the query . key
 * path code (`enum isa`) and the scores of query rows against a tile of LANES keys by
 * vdpbf16ps on bf16 pairs. The functions carry their own target, so a file including
 * this builds on any x86 host; callers take this path only where
 * __builtin_cpu_supports("avx512bf16"). */

#ifndef ACCORD_PAGED_ATTENTION_BF16_H
#define ACCORD_PAGED_ATTENTION_BF16_H

#include <immintrin.h>
#include <stdint.h>
#include "lanes.h"

/* How a kernel computes its products (the callers' `Isa` in _native_attention.py). */
enum isa { ISA_FP32 = 0, ISA_AVX512_BF16 = 1 };

/* Query rows whose scores are accumulated side by side in registers. */
#define SCORE_ROWS 8

/* scores[r][j] = scale * (query row r . key j) for nb rows (a constant where this is
 * inlined) and the LANES keys of a tile, each pair of channels in one vdpbf16ps: q holds
 * the rows as bf16 pairs (`pairs` each), keys the tile pair-major ([pairs][LANES]);
 * two chains per key, the even pairs and the odd pairs, each ascending, added at the end
 * (one chain per key left four rows waiting on vdpbf16ps' latency: 8% of a decode call).
 * Products of bf16 inputs are exact in fp32. */
static inline __attribute__((always_inline, target("avx512f,avx512bf16"))) void score_rows_bf16(
    const uint32_t *q, long pairs, const uint32_t *keys, const int nb, float scale, float *scores) {
    __m512 even[SCORE_ROWS], odd[SCORE_ROWS];
    for (int r = 0; r < nb; ++r) even[r] = _mm512_setzero_ps(), odd[r] = _mm512_setzero_ps();
    long i = 0;
    for (; i + 2 <= pairs; i += 2) {
        const __m512bh k0 = (__m512bh)_mm512_loadu_si512(keys + i * LANES),
                       k1 = (__m512bh)_mm512_loadu_si512(keys + (i + 1) * LANES);
        for (int r = 0; r < nb; ++r) {
            even[r] = _mm512_dpbf16_ps(even[r], k0, (__m512bh)_mm512_set1_epi32((int)q[r * pairs + i]));
            odd[r] = _mm512_dpbf16_ps(odd[r], k1, (__m512bh)_mm512_set1_epi32((int)q[r * pairs + i + 1]));
        }
    }
    if (i < pairs) {
        const __m512bh k = (__m512bh)_mm512_loadu_si512(keys + i * LANES);
        for (int r = 0; r < nb; ++r) even[r] = _mm512_dpbf16_ps(even[r], k, (__m512bh)_mm512_set1_epi32((int)q[r * pairs + i]));
    }
    for (int r = 0; r < nb; ++r)
        _mm512_storeu_ps(scores + r * LANES, _mm512_mul_ps(_mm512_add_ps(even[r], odd[r]), _mm512_set1_ps(scale)));
}

/* score_rows_bf16 for `rows` rows, SCORE_ROWS at a time, then SCORE_ROWS / 2, then one
 * at a time (a decode query group of 4 in one pass: its rows' chains side by side hide
 * vdpbf16ps' latency). */
__attribute__((target("avx512f,avx512bf16"))) static void score_bf16(const uint32_t *q, long rows, long pairs,
                                                                     const uint32_t *keys, float scale,
                                                                     float *scores) {
    long r = 0;
    for (; r + SCORE_ROWS <= rows; r += SCORE_ROWS)
        score_rows_bf16(q + r * pairs, pairs, keys, SCORE_ROWS, scale, scores + r * LANES);
    if (r + SCORE_ROWS / 2 <= rows) {
        score_rows_bf16(q + r * pairs, pairs, keys, SCORE_ROWS / 2, scale, scores + r * LANES);
        r += SCORE_ROWS / 2;
    }
    for (; r < rows; ++r) score_rows_bf16(q + r * pairs, pairs, keys, 1, scale, scores + r * LANES);
}

#endif
