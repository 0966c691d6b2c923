/* What the paged attention kernels (paged_decode_attention.c, paged_prefill_attention.c)
 * share beside lanes.h's vectors, row loaders and lane sum: a vector exp, and the
 * addressing of a position's row in the paged cache through a block table. */

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
