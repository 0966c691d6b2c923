/* What the paged attention kernels (paged_decode_attention.c, paged_prefill_attention.c)
 * share beside lanes.h's vectors, row loaders and lane sum: a vector exp, the online
 * softmax of a tile of scores, and the addressing of a position's row in the paged cache
 * through a block table. */

#ifndef ACCORD_PAGED_ATTENTION_H
#define ACCORD_PAGED_ATTENTION_H

#include <stdint.h>
#include <string.h>
#include "bf16.h"
#include "lanes.h"

typedef int32_t vint __attribute__((vector_size(LANES * 4)));

/* e^x for x <= 0 (scores minus their maximum), lane by lane: Cephes' expf (a degree-6
 * polynomial on x - n ln2, times 2^n), within 2 ulp of expf. Inputs below -87 give
 * e^-87 (~1.6e-38) instead of a subnormal or 0: nothing a softmax weight of a sum >= 1
 * can tell apart. libm's expf, one call per score, costs about a fifth of the kernel. */
static inline vfloat exp_lanes(vfloat x) {
    const vfloat low = (vfloat){0} - 87.0f;
    vint below = x < low;
    vint xi, li;
    memcpy(&xi, &x, sizeof xi);
    memcpy(&li, &low, sizeof li);
    xi = (xi & ~below) | (li & below);
    memcpy(&x, &xi, sizeof x);
    const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    vfloat n = (x * 1.44269504088896341f + shifter) - shifter;
    vfloat r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    vfloat p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    vint bits = (__builtin_convertvector(n, vint) + 127) << 23;
    vfloat scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* Lane by lane, x where it is greater than y, else y. */
static inline vfloat max_lanes(vfloat x, vfloat y) {
    const vint greater = x > y;
    vint xi, yi;
    memcpy(&xi, &x, sizeof xi);
    memcpy(&yi, &y, sizeof yi);
    xi = (xi & greater) | (yi & ~greater);
    memcpy(&x, &xi, sizeof x);
    return x;
}

/* Unaligned fp32 vector loads and stores the compiler keeps in registers (a memcpy into
 * an array of vectors made GCC copy every value row through the stack). */
typedef float vfloat_u __attribute__((vector_size(LANES * 4), aligned(4), may_alias));
static inline vfloat loadv(const float *p) { return *(const vfloat_u *)p; }
static inline void storev(float *p, vfloat v) { *(vfloat_u *)p = v; }

/* The online softmax of one row's tile of scores: positions p0 + j visible to a query at
 * position `pos` (causal, and inside the window when there is one) keep their score,
 * the others weigh 0; the running maximum, sum and accumulator are updated and the
 * scores replaced by their weights e^(score - maximum). */
static void softmax_tile(float *scores, long p0, long pos, long window, float *top, float *total, float *acc,
                         long vd) {
    const vint iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const vint p = iota + (int32_t)p0;
    const long first = window > 0 ? pos - window + 1 : 0;
    const vint seen = (p <= (int32_t)pos) & (p >= (int32_t)first);
    vfloat x;
    memcpy(&x, scores, sizeof x);
    const vfloat none = (vfloat){0} - __builtin_inff();
    vint xi, ni;
    memcpy(&xi, &x, sizeof xi);
    memcpy(&ni, &none, sizeof ni);
    xi = (xi & seen) | (ni & ~seen);
    memcpy(&x, &xi, sizeof x);
    /* The tile's maximum as a halving tree of lane maxima (lane 0 ends with it). */
    vfloat m = max_lanes(x, __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
    m = max_lanes(m, __builtin_shufflevector(m, m, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
    m = max_lanes(m, __builtin_shufflevector(m, m, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
    m = max_lanes(m, __builtin_shufflevector(m, m, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
    const float tile_top = m[0];
    if (tile_top == -__builtin_inff()) { /* nothing of this tile is visible to the row */
        memset(scores, 0, sizeof x);
        return;
    }
    /* The accumulator's rescale e^(old - new maximum): 1 (no exp, no pass over it) while
     * the maximum stays, 0 before the row's first visible position. */
    const float new_top = tile_top > *top ? tile_top : *top;
    const float scale = *top == -__builtin_inff() ? 0.0f
                        : new_top == *top          ? 1.0f
                                                   : exp_lanes((vfloat){0} + (*top - new_top))[0];
    vfloat e = exp_lanes(x - new_top);
    vint ei;
    memcpy(&ei, &e, sizeof ei);
    ei &= seen; /* exp_lanes clamps far below the maximum instead of reaching 0: hidden is 0 */
    memcpy(&e, &ei, sizeof e);
    storev(total, loadv(total) * scale + e);
    *top = new_top;
    memcpy(scores, &e, sizeof e);
    if (scale != 1.0f)
        for (long i = 0; i < vd; ++i) acc[i] *= scale;
}

static inline long read_index(const void *p, long i, int index_bytes) {
    return index_bytes == 8 ? (long)((const int64_t *)p)[i] : (long)((const int32_t *)p)[i];
}

/* Where the cache holds what the kernel reads. Strides are in elements; a position's
 * channels are contiguous. */
struct cache {
    const void *keys, *values;
    long block_stride, slot_stride, head_stride;
    long block_size, key_dim, value_dim;
};

/* The element offsets in the caches of kv head `head` at the visible positions
 * [first, len) of a sequence, walking its block table block by block (a division per
 * position would cost more than the position's dot products). */
static void position_offsets(const struct cache *c, const void *table, int index_bytes, long head, long first,
                             long len, long *offsets) {
    long p = first;
    for (long k = first / c->block_size; p < len; ++k) {
        const long base = read_index(table, k, index_bytes) * c->block_stride + head * c->head_stride;
        const long end = (k + 1) * c->block_size < len ? (k + 1) * c->block_size : len;
        for (long slot = p - k * c->block_size; p < end; ++p, ++slot) *offsets++ = base + slot * c->slot_stride;
    }
}


/* Query rows in, output rows out, in their dtypes. */
struct rows {
    const void *query;
    void *out;
    int q_dtype, out_dtype;
    long q_row_stride, q_head_stride, out_row_stride, out_head_stride;
};

/* run(work, task) for every task in [0, tasks), with `threads` OpenMP threads taking
 * one task at a time, or in the calling thread alone when threads < 2 (not even a
 * one-thread parallel region: its set-up costs about a microsecond, a tenth of a small
 * decode call). Returns whether any task failed (returned non-zero). */
static int run_tasks(int (*run)(const void *work, long task), const void *work, long tasks, long threads) {
    int failed = 0;
    if (threads > 1) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
        for (long task = 0; task < tasks; ++task)
            if (run(work, task)) {
#pragma omp atomic write
                failed = 1;
            }
    } else {
        for (long task = 0; task < tasks; ++task) failed |= run(work, task);
    }
    return failed;
}

#endif
