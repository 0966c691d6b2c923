/* Decode attention over the paged KV cache, read in place: for every sequence of a varlen
 * step that has exactly one new query row, and each of its kv heads, the scores of the
 * head's query group against the sequence's visible cached keys, an fp32 softmax
 * (max-subtracted) and the fp32 weighted sum of the values, written to the output row.
 * No key or value is copied: each cached position is found through the block table.
 *
 * Each (sequence, kv head) is computed alone in one fixed order (positions ascending,
 * channels in vector lanes, lanes summed as a fixed tree), so a sequence gets the same
 * bits whatever else is in the step and however many threads run: batch invariance.
 * A sequence of more than PARTITION visible positions is split over them (flash-decoding
 * style): each partition of PARTITION positions is a task giving its rows normalised by
 * its own softmax sum, with that sum and its maximum, and combine_partitions merges them
 * in partition order. Whether and where a sequence splits depends on its own length
 * alone (never on the threads or the step), so the split keeps batch invariance, and a
 * shorter sequence gets the same bits as before the split existed. It lets one long
 * sequence use every thread (one of 4K-32K positions, 3 kv heads on 2 threads: 1.0-1.45x
 * on the AVX512-BF16 path, 1.4-2.0x on fp32 lanes; docs/performance.md).
 *
 * Keys and values may be fp32 or bf16 (widened exactly), the query and the output each
 * fp32 or bf16 (stored rounded to nearest even). The key of a position is key_dim
 * channels at key_cache, its value value_dim channels at value_cache; MLA passes the
 * latent cache as both (the value is the key's first value_dim channels). Built by
 * _native.py with -march=native: the vector extensions below become AVX512 or AVX2
 * code. A bf16 query and cache may instead take the AVX512-BF16 path (`isa`, see
 * attend_heads_bf16: single pass, vdpbf16ps for both products), whose functions carry
 * their own target. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "paged_attention.h"
#include "paged_attention_bf16.h"

/* w[0, n) = e^(w - top) / their sum, in place (n >= 1); top and the sum to stats[0]
 * and stats[1] (what combine_partitions weighs a partition's rows by). */
static void softmax(float *w, long n, float *stats) {
    /* The maximum lane by lane, then of the lanes (a chain of scalar maxima would cost
     * as much as the exponentials). */
    vfloat tops = (vfloat){0} + w[0];
    long t = 0;
    for (; t + LANES <= n; t += LANES) {
        vfloat x;
        memcpy(&x, w + t, sizeof x);
        tops = max_lanes(x, tops);
    }
    float top = tops[0];
    for (int j = 1; j < LANES; ++j) top = tops[j] > top ? tops[j] : top;
    for (; t < n; ++t) top = w[t] > top ? w[t] : top;
    vfloat total = {0};
    for (t = 0; t + LANES <= n; t += LANES) {
        vfloat x;
        memcpy(&x, w + t, sizeof x);
        const vfloat e = exp_lanes(x - top);
        total += e;
        memcpy(w + t, &e, sizeof e);
    }
    if (t < n) {
        vfloat x = (vfloat){0} + top; /* the padding lanes give e^0, left out of the sum */
        memcpy(&x, w + t, (n - t) * sizeof(float));
        vfloat e = exp_lanes(x - top);
        for (long j = n - t; j < LANES; ++j) e[j] = 0.0f;
        total += e;
        memcpy(w + t, &e, (n - t) * sizeof(float));
    }
    const float sum = lane_sum(total), inv = 1.0f / sum;
    stats[0] = top, stats[1] = sum;
    for (long t = 0; t < n; ++t) w[t] *= inv;
}

/* The dot product of an fp32 query row with a cached key, in one fixed order whichever
 * caller asks (channels in lanes, then lane_sum, then the scalar tail). */
static inline __attribute__((always_inline)) float dot(const float *q, const char *key, long kd, const int kv_dtype) {
    vfloat acc = {0};
    long i = 0;
    for (; i + LANES <= kd; i += LANES) acc += load_lanes(q, i, FP32) * load_lanes(key, i, kv_dtype);
    float s = lane_sum(acc);
    for (; i < kd; ++i) s += q[i] * load_one(key, i, kv_dtype);
    return s;
}

/* How many positions ahead the rows to come are prefetched: a sequence's rows are
 * scattered over its blocks (a head's row is one of Hk in a slot), which the hardware
 * prefetcher does not follow. */
#define PREFETCH_AHEAD 8

static inline void prefetch_row(const char *row, long bytes) {
    for (long b = 0; b < bytes; b += 64) __builtin_prefetch(row + b);
}

/* Positions whose value rows are summed in registers before they are added to the
 * accumulator (the rows stay in L1 while every query of the group reads them). */
#define VALUE_TILE 32
/* Positions whose dot products are interleaved (independent chains hide the FMA
 * latency); each dot is still computed alone, in the order of `dot`. */
#define KEY_TILE 4

/* acc[vd] += sum over t in [t0, t1) of w[t] * value row t, the tile's sum formed in
 * registers (a fixed order: channels in groups of four vectors, positions ascending). */
static inline __attribute__((always_inline)) void add_weighted_values(
    const struct cache *c, const int kv_dtype, const long *offsets, long t0, long t1, const float *w,
    float *acc) {
    const long vd = c->value_dim, esize = kv_dtype == BF16 ? 2 : 4;
    const char *values = (const char *)c->values;
    long i = 0;
    for (; i + 4 * LANES <= vd; i += 4 * LANES) {
        vfloat a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (long t = t0; t < t1; ++t) {
            const char *v = values + offsets[t] * esize;
            if (i == 0 && t + PREFETCH_AHEAD < t1) prefetch_row(values + offsets[t + PREFETCH_AHEAD] * esize, vd * esize);
            a0 += w[t] * load_lanes(v, i, kv_dtype);
            a1 += w[t] * load_lanes(v, i + LANES, kv_dtype);
            a2 += w[t] * load_lanes(v, i + 2 * LANES, kv_dtype);
            a3 += w[t] * load_lanes(v, i + 3 * LANES, kv_dtype);
        }
        vfloat sums[4] = {a0, a1, a2, a3};
        for (int j = 0; j < 4; ++j) {
            vfloat total = load_lanes(acc, i + j * LANES, FP32) + sums[j];
            memcpy(acc + i + j * LANES, &total, sizeof total);
        }
    }
    for (; i + LANES <= vd; i += LANES) {
        vfloat a = {0};
        for (long t = t0; t < t1; ++t) a += w[t] * load_lanes(values + offsets[t] * esize, i, kv_dtype);
        vfloat total = load_lanes(acc, i, FP32) + a;
        memcpy(acc + i, &total, sizeof total);
    }
    for (; i < vd; ++i) {
        float a = 0.0f;
        for (long t = t0; t < t1; ++t) a += w[t] * load_one(values + offsets[t] * esize, i, kv_dtype);
        acc[i] += a;
    }
}

/* One decode row's attention for one kv head: q holds its group's `group` query rows
 * (fp32, key_dim each), offsets the n visible positions' cache offsets; writes `group`
 * output rows of value_dim channels to acc (fp32) and each row's softmax (maximum, sum)
 * to stats, using scores (group * n floats) as scratch. `kv_dtype` is a constant where this is inlined, so each cache dtype gets its
 * own loops. */
static inline __attribute__((always_inline)) void attend_head(
    const struct cache *c, const int kv_dtype, const long *offsets, long n, const float *q, long group,
    float scale, float *scores, float *acc, float *stats) {
    const long kd = c->key_dim, vd = c->value_dim, esize = kv_dtype == BF16 ? 2 : 4;
    const char *keys = (const char *)c->keys;
    long t = 0;
    for (; t + KEY_TILE <= n; t += KEY_TILE) {
        if (t + PREFETCH_AHEAD + KEY_TILE <= n)
            for (int j = 0; j < KEY_TILE; ++j) prefetch_row(keys + offsets[t + PREFETCH_AHEAD + j] * esize, kd * esize);
        const char *k0 = keys + offsets[t] * esize, *k1 = keys + offsets[t + 1] * esize,
                   *k2 = keys + offsets[t + 2] * esize, *k3 = keys + offsets[t + 3] * esize;
        for (long g = 0; g < group; ++g) {
            const float *qg = q + g * kd;
            float *sg = scores + g * n + t;
            sg[0] = dot(qg, k0, kd, kv_dtype) * scale;
            sg[1] = dot(qg, k1, kd, kv_dtype) * scale;
            sg[2] = dot(qg, k2, kd, kv_dtype) * scale;
            sg[3] = dot(qg, k3, kd, kv_dtype) * scale;
        }
    }
    for (; t < n; ++t)
        for (long g = 0; g < group; ++g) scores[g * n + t] = dot(q + g * kd, keys + offsets[t] * esize, kd, kv_dtype) * scale;
    for (long g = 0; g < group; ++g) {
        softmax(scores + g * n, n, stats + 2 * g);
        memset(acc + g * vd, 0, vd * sizeof(float));
    }
    for (long t0 = 0; t0 < n; t0 += VALUE_TILE) {
        const long t1 = t0 + VALUE_TILE < n ? t0 + VALUE_TILE : n;
        for (long g = 0; g < group; ++g) add_weighted_values(c, kv_dtype, offsets, t0, t1, scores + g * n, acc + g * vd);
    }
}

/* The chunked path, for key and value widths that are multiples of CHUNK (64, 128, 256,
 * MLA's 576 and 512; other widths take attend_head above). A chunk is CHUNK channels in
 * two vectors. A bf16 chunk is read as LANES 32-bit lanes of two channels each: shifted
 * left by 16 they are the even channels, masked to their high half the odd ones, both
 * exact fp32 and with no shuffle. So queries and accumulators are kept in that order
 * (`reorder_chunks`), and each key and value row is read and widened once per kv head,
 * for up to QUERY_TILE queries of its group at a time. */
#define CHUNK (2 * LANES)
#define QUERY_TILE 4

_Static_assert(LANES == 16, "lane_sums' merges are written for 16 lanes");

/* A row of fp32 channels (dim a multiple of CHUNK) into chunk order in place, or back
 * (`back`): a bf16 chunk holds its even channels then its odd ones, an fp32 chunk its
 * channels in order. */
static void reorder_chunks(float *row, long dim, int kv_dtype, int back) {
    if (kv_dtype != BF16) return;
    for (long i = 0; i < dim; i += CHUNK) {
        vfloat a, b, first, second;
        memcpy(&a, row + i, sizeof a);
        memcpy(&b, row + i + LANES, sizeof b);
        if (back) {
            first = __builtin_shufflevector(a, b, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
            second = __builtin_shufflevector(a, b, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
        } else {
            first = __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
            second = __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        }
        memcpy(row + i, &first, sizeof first);
        memcpy(row + i + LANES, &second, sizeof second);
    }
}

/* The chunk at element i of a row of `dtype`, as two fp32 vectors in chunk order. */
static inline __attribute__((always_inline)) void load_chunk(const char *row, long i, const int dtype, vfloat *first,
                                                            vfloat *second) {
    if (dtype == BF16) {
        vuint pairs;
        memcpy(&pairs, (const uint16_t *)row + i, sizeof pairs);
        const vuint even = pairs << 16, odd = pairs & 0xffff0000u;
        memcpy(first, &even, sizeof *first);
        memcpy(second, &odd, sizeof *second);
    } else {
        memcpy(first, (const float *)row + i, sizeof *first);
        memcpy(second, (const float *)row + i + LANES, sizeof *second);
    }
}

/* Two vectors of partial sums merged into one: every group of 2b lanes of x and of y
 * (one part's partial sums) becomes b lanes (its halves added), x's group then y's.
 * MERGE_LANE is the lane of x:y (x's lanes 0-15, y's 16-31) that goes to output lane k:
 * its group's lower half (half 0) or upper half (half 1). */
#define MERGE_LANE(k, b, half) (((k) / (b)) % 2 * LANES + (k) / (2 * (b)) * 2 * (b) + (k) % (b) + (half) * (b))
#define MERGE_HALF(x, y, b, half)                                                                                  \
    __builtin_shufflevector(x, y, MERGE_LANE(0, b, half), MERGE_LANE(1, b, half), MERGE_LANE(2, b, half),          \
                            MERGE_LANE(3, b, half), MERGE_LANE(4, b, half), MERGE_LANE(5, b, half),                \
                            MERGE_LANE(6, b, half), MERGE_LANE(7, b, half), MERGE_LANE(8, b, half),                \
                            MERGE_LANE(9, b, half), MERGE_LANE(10, b, half), MERGE_LANE(11, b, half),              \
                            MERGE_LANE(12, b, half), MERGE_LANE(13, b, half), MERGE_LANE(14, b, half),             \
                            MERGE_LANE(15, b, half))
#define MERGE(x, y, b) (MERGE_HALF(x, y, b, 0) + MERGE_HALF(x, y, b, 1))

/* Where part p goes in lane_sums' input so that its sum comes out in lane p: the merge
 * tree sends input slot s to lane bit_reverse(s). */
static const int MERGE_SLOT[LANES] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

/* The lane sums of LANES parts (stored at their MERGE_SLOT) as one vector, lane p the
 * sum of part p: every part's lanes are added in one fixed tree, as in lane_sum, at
 * about two shuffles per part instead of five. */
static inline __attribute__((always_inline)) vfloat lane_sums(const vfloat *slots) {
    vfloat eights[8], fours[4], twos[2];
    for (int k = 0; k < 8; ++k) eights[k] = MERGE(slots[2 * k], slots[2 * k + 1], 8);
    for (int k = 0; k < 4; ++k) fours[k] = MERGE(eights[2 * k], eights[2 * k + 1], 4);
    for (int k = 0; k < 2; ++k) twos[k] = MERGE(fours[2 * k], fours[2 * k + 1], 2);
    return MERGE(twos[0], twos[1], 1);
}

/* scores[g * stride + p] = scale * (query g . key of position p) for the LANES
 * positions at offsets and the tile's gq queries (q: gq rows of kd, chunk order), each
 * dot product in one order: chunks ascending, one chain per lane, then lane_sums. The
 * keys of the next tile are prefetched when `next` is set. */
static inline __attribute__((always_inline)) void score_tile(const struct cache *c, const int kv_dtype,
                                                            const long kd, const long *offsets, int next,
                                                            const float *q, const int gq, float scale,
                                                            float *scores, long stride) {
    const long esize = kv_dtype == BF16 ? 2 : 4;
    const char *keys = (const char *)c->keys;
    vfloat slots[QUERY_TILE][LANES];
    for (int p = 0; p < LANES; ++p) {
        if (next) prefetch_row(keys + offsets[LANES + p] * esize, kd * esize);
        const char *key = keys + offsets[p] * esize;
        vfloat acc[QUERY_TILE] = {{0}};
        for (long i = 0; i < kd; i += CHUNK) {
            vfloat first, second;
            load_chunk(key, i, kv_dtype, &first, &second);
            for (int g = 0; g < gq; ++g) {
                acc[g] += load_lanes(q + g * kd, i, FP32) * first;
                acc[g] += load_lanes(q + g * kd, i + LANES, FP32) * second;
            }
        }
        for (int g = 0; g < gq; ++g) slots[g][MERGE_SLOT[p]] = acc[g];
    }
    for (int g = 0; g < gq; ++g) {
        const vfloat s = lane_sums(slots[g]) * scale;
        memcpy(scores + g * stride, &s, sizeof s);
    }
}

/* acc[g * vd + i + k * LANES ...] = the weighted sum over the n positions of the value
 * rows' `chunks` chunks (1 or 2) at channel i, weights w[g * stride + t], for the tile's
 * gq queries: one chain per lane, positions ascending. */
static inline __attribute__((always_inline)) void weigh_values(const struct cache *c, const int kv_dtype,
                                                              const long *offsets, long n, long i, const int chunks,
                                                              const float *w, long stride, const int gq, float *acc) {
    const long vd = c->value_dim, esize = kv_dtype == BF16 ? 2 : 4;
    const char *values = (const char *)c->values;
    vfloat sums[QUERY_TILE][4] = {{{0}}};
    for (long t = 0; t < n; ++t) {
        if (i == 0 && t + PREFETCH_AHEAD < n) prefetch_row(values + offsets[t + PREFETCH_AHEAD] * esize, vd * esize);
        const char *v = values + offsets[t] * esize;
        vfloat x[4];
        for (int k = 0; k < chunks; ++k) load_chunk(v, i + k * CHUNK, kv_dtype, &x[2 * k], &x[2 * k + 1]);
        for (int g = 0; g < gq; ++g) {
            const float weight = w[g * stride + t];
            for (int k = 0; k < 2 * chunks; ++k) sums[g][k] += weight * x[k];
        }
    }
    for (int g = 0; g < gq; ++g)
        for (int k = 0; k < 2 * chunks; ++k) memcpy(acc + g * vd + i + k * LANES, &sums[g][k], sizeof(vfloat));
}

/* attend_head's work for gq queries of a group on the chunked path (kv_dtype, kd and
 * gq are constants where this is inlined): offsets are padded to a multiple of LANES
 * (the padding repeats a real position, its scores are not used), scores has a row of
 * `stride` for each query. */
static inline __attribute__((always_inline)) void attend_queries(const struct cache *c, const int kv_dtype,
                                                                const long kd, const long *offsets, long n,
                                                                long stride, const float *q, const int gq,
                                                                float scale, float *scores, float *acc,
                                                                float *stats) {
    const long vd = c->value_dim;
    for (long t = 0; t < stride; t += LANES)
        score_tile(c, kv_dtype, kd, offsets + t, t + LANES < stride, q, gq, scale, scores + t, stride);
    for (int g = 0; g < gq; ++g) softmax(scores + g * stride, n, stats + 2 * g);
    long i = 0;
    for (; i + 2 * CHUNK <= vd; i += 2 * CHUNK) weigh_values(c, kv_dtype, offsets, n, i, 2, scores, stride, gq, acc);
    if (i < vd) weigh_values(c, kv_dtype, offsets, n, i, 1, scores, stride, gq, acc);
}

/* attend_queries for a group's queries, QUERY_TILE at a time, then a tile of two and
 * one of one for what is left (three more instances would cost build time for groups of
 * 3 or 7 only), each tile in the same order whatever the step holds (kv_dtype and kd
 * constants where this is inlined). */
static inline __attribute__((always_inline)) void attend_group(const struct cache *c, const int kv_dtype,
                                                              const long kd, const long *offsets, long n,
                                                              long stride, const float *q, long group,
                                                              float scale, float *scores, float *acc,
                                                              float *stats) {
    const long vd = c->value_dim;
    for (long g = 0; g < group;) {
        const float *qg = q + g * kd;
        float *sg = scores + g * stride, *ag = acc + g * vd;
        const long left = group - g;
        if (left >= QUERY_TILE) {
            attend_queries(c, kv_dtype, kd, offsets, n, stride, qg, QUERY_TILE, scale, sg, ag, stats + 2 * g);
            g += QUERY_TILE;
        } else if (left >= 2) {
            attend_queries(c, kv_dtype, kd, offsets, n, stride, qg, 2, scale, sg, ag, stats + 2 * g);
            g += 2;
        } else {
            attend_queries(c, kv_dtype, kd, offsets, n, stride, qg, 1, scale, sg, ag, stats + 2 * g);
            g += 1;
        }
    }
}

/* attend_head on the chunked path (q and acc in chunk order). Head size 64 with a bf16
 * cache has its key width as a constant, so that its dot products unroll (~20% of the
 * call); each such instance costs about a third of a second of build time at a cold
 * start-up, 128 would cost a second for less. */
static inline __attribute__((always_inline)) void attend_head_chunked(const struct cache *c, const int kv_dtype,
                                                                     const long *offsets, long n, long stride,
                                                                     const float *q, long group, float scale,
                                                                     float *scores, float *acc, float *stats) {
    if (kv_dtype == BF16 && c->key_dim == 64)
        attend_group(c, kv_dtype, 64, offsets, n, stride, q, group, scale, scores, acc, stats);
    else
        attend_group(c, kv_dtype, c->key_dim, offsets, n, stride, q, group, scale, scores, acc, stats);
}

/* The AVX512-BF16 path (`isa`), for a bf16 query and cache whose key and value widths
 * are multiples of 32: single pass over the visible positions, LANES at a time from the
 * sequence's first visible one, flash-style. A tile's keys are transposed to bf16 pairs
 * (pair-major, in registers) and scored by score_bf16 (vdpbf16ps, exact products, fp32
 * sums) for the whole query group; softmax_tile keeps each query's running maximum, sum
 * and accumulator; then the weights e^(score - maximum) are rounded to bf16 (nearest
 * even, relative error at most 2^-9 each) and the values weighed by vdpbf16ps over pairs
 * of positions, summed in fp32. The sum the output is divided by is that of the fp32
 * weights. Padding positions of the last tile repeat a real position (finite values)
 * and weigh exactly 0. */

/* kt[i][j] = pair i0 + i of key j's row (16 pairs of each of the tile's LANES keys at
 * offsets), a 16 x 16 transpose of 32-bit pairs in registers: unpacks of 32 and 64 bits
 * within 128-bit lanes, then a 4 x 4 transpose of the lanes. */
static inline __attribute__((always_inline, target("avx512f,avx512bf16"))) void transpose_pairs(
    const uint16_t *keys, const long *offsets, long i0, uint32_t *kt) {
    __m512i r[LANES], t[LANES];
    for (int j = 0; j < LANES; ++j) r[j] = _mm512_loadu_si512(keys + offsets[j] + 2 * i0);
    for (int k = 0; k < LANES; k += 2) {
        t[k] = _mm512_unpacklo_epi32(r[k], r[k + 1]);
        t[k + 1] = _mm512_unpackhi_epi32(r[k], r[k + 1]);
    }
    /* r[4k + e], lane L: pair 4L + e of keys 4k .. 4k + 3. */
    for (int k = 0; k < LANES; k += 4) {
        r[k] = _mm512_unpacklo_epi64(t[k], t[k + 2]);
        r[k + 1] = _mm512_unpackhi_epi64(t[k], t[k + 2]);
        r[k + 2] = _mm512_unpacklo_epi64(t[k + 1], t[k + 3]);
        r[k + 3] = _mm512_unpackhi_epi64(t[k + 1], t[k + 3]);
    }
    for (int e = 0; e < 4; ++e) {
        const __m512i low01 = _mm512_shuffle_i32x4(r[e], r[4 + e], 0x44), high01 = _mm512_shuffle_i32x4(r[e], r[4 + e], 0xee);
        const __m512i low23 = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0x44),
                      high23 = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0xee);
        _mm512_storeu_si512(kt + (0 + e) * LANES, _mm512_shuffle_i32x4(low01, low23, 0x88));
        _mm512_storeu_si512(kt + (4 + e) * LANES, _mm512_shuffle_i32x4(low01, low23, 0xdd));
        _mm512_storeu_si512(kt + (8 + e) * LANES, _mm512_shuffle_i32x4(high01, high23, 0x88));
        _mm512_storeu_si512(kt + (12 + e) * LANES, _mm512_shuffle_i32x4(high01, high23, 0xdd));
    }
}

/* Queries whose value sums are held in registers together (two vectors each). */
#define PAIR_QUERIES 8

/* acc[g] += the tile's weighted value rows for nb queries (a constant where this is
 * inlined), w[g][m] the bf16 pair of weights of positions 2m and 2m + 1. Per 32 channels
 * at i, the two rows' halves interleaved by unpacks of 16 bits hold one position pair
 * per lane: acc[g][i + l] is channel 8 (l / 4) + l % 4 of the block, acc[g][i + 16 + l]
 * channel 8 (l / 4) + 4 + l % 4 (`unpermute_values` restores the order). */
static inline __attribute__((always_inline, target("avx512f,avx512bf16"))) void weigh_pairs(
    const uint16_t *values, const long *offsets, long vd, const uint32_t *w, const int nb, float *acc) {
    for (long i = 0; i < vd; i += 32) {
        __m512 a[PAIR_QUERIES][2];
        for (int g = 0; g < nb; ++g) a[g][0] = _mm512_loadu_ps(acc + g * vd + i), a[g][1] = _mm512_loadu_ps(acc + g * vd + i + 16);
        for (int m = 0; m < LANES / 2; ++m) {
            const __m512i x = _mm512_loadu_si512(values + offsets[2 * m] + i),
                          y = _mm512_loadu_si512(values + offsets[2 * m + 1] + i);
            const __m512bh low = (__m512bh)_mm512_unpacklo_epi16(x, y), high = (__m512bh)_mm512_unpackhi_epi16(x, y);
            for (int g = 0; g < nb; ++g) {
                const __m512bh weights = (__m512bh)_mm512_set1_epi32((int)w[g * (LANES / 2) + m]);
                a[g][0] = _mm512_dpbf16_ps(a[g][0], low, weights);
                a[g][1] = _mm512_dpbf16_ps(a[g][1], high, weights);
            }
        }
        for (int g = 0; g < nb; ++g) _mm512_storeu_ps(acc + g * vd + i, a[g][0]), _mm512_storeu_ps(acc + g * vd + i + 16, a[g][1]);
    }
}

/* weigh_pairs for a group's queries, PAIR_QUERIES at a time, then PAIR_QUERIES / 2, then
 * one at a time (a query group of 4 in one pass: one query's two chains alone wait on
 * vdpbf16ps' latency). */
__attribute__((target("avx512f,avx512bf16"))) static void weigh_group(const uint16_t *values, const long *offsets,
                                                                      long vd, const uint32_t *w, long group,
                                                                      float *acc) {
    long g = 0;
    for (; g + PAIR_QUERIES <= group; g += PAIR_QUERIES)
        weigh_pairs(values, offsets, vd, w + g * (LANES / 2), PAIR_QUERIES, acc + g * vd);
    if (g + PAIR_QUERIES / 2 <= group) {
        weigh_pairs(values, offsets, vd, w + g * (LANES / 2), PAIR_QUERIES / 2, acc + g * vd);
        g += PAIR_QUERIES / 2;
    }
    for (; g < group; ++g) weigh_pairs(values, offsets, vd, w + g * (LANES / 2), 1, acc + g * vd);
}

/* w[g][.] = the tile's LANES fp32 weights of query g as bf16, nearest even (pairs of
 * consecutive positions in each 32-bit word). */
__attribute__((target("avx512f,avx512bf16"))) static void round_weights(const float *weights, long group,
                                                                        uint32_t *w) {
    for (long g = 0; g < group; ++g)
        _mm256_storeu_si256((__m256i *)(w + g * (LANES / 2)), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(weights + g * LANES)));
}

/* A value accumulator row back from weigh_pairs' order to channel order, divided by the
 * softmax sum, into the fp32 row `out`. */
static void unpermute_values(const float *acc, long vd, float inv, float *out) {
    for (long i = 0; i < vd; i += 32)
        for (int l = 0; l < 16; ++l) {
            out[i + 8 * (l / 4) + l % 4] = acc[i + l] * inv;
            out[i + 8 * (l / 4) + 4 + l % 4] = acc[i + 16 + l] * inv;
        }
}

/* How many tiles ahead of its products attend_heads_bf16 prefetches the cache rows (one
 * tile ahead left part of the latency exposed: 69% of copy bandwidth against 75% on 32
 * sequences of 4096 positions). */
#define PREFETCH_TILES 2

/* The first `bytes` of the bf16 rows at offsets [j0, j1) of `cache` into the caches. */
static inline void prefetch_rows(const uint16_t *cache, const long *offsets, long j0, long j1, long bytes) {
    for (long j = j0; j < j1; ++j) prefetch_row((const char *)(cache + offsets[j]), bytes);
}

/* attend_task's work on the AVX512-BF16 path for `heads` kv heads of one sequence (the
 * head at element h * head_stride of each cache row): q the heads' query groups as bf16
 * pairs (head-major), offsets the n positions of the first head (first at `first`, all
 * visible) padded to `stride`, a multiple of LANES; writes the groups' normalised fp32
 * output rows to out (head-major) and each row's softmax (maximum, sum) to stats. Each tile of positions is read for every head before
 * the next, so the sequence's cache rows are read in order, whole. Each head is computed
 * as it would be alone. scratch holds (kd / 2 + 2 * group) * LANES +
 * heads * group * (vd + LANES + 1) 32-bit words. */
static void attend_heads_bf16(const struct cache *c, const long *offsets, long first, long n, long stride,
                              long heads, const uint32_t *q, long group, float scale, uint32_t *scratch,
                              float *out, float *stats) {
    const long kd = c->key_dim, vd = c->value_dim, pairs = kd / 2, hs = c->head_stride, rows = heads * group;
    uint32_t *kt = scratch, *w = kt + pairs * LANES;
    float *scores = (float *)(w + group * (LANES / 2)), *total = scores + group * LANES, *top = total + rows * LANES,
          *acc = top + rows;
    for (long g = 0; g < rows; ++g) top[g] = -__builtin_inff();
    memset(total, 0, rows * LANES * sizeof(float));
    memset(acc, 0, rows * vd * sizeof(float));
    /* Only the padding past the last position is masked (window 0): the caller's
     * positions are all visible. */
    const long last = first + n - 1;
    /* The bytes of a position's rows from the first head's to the end of the last's. */
    const long key_span = ((heads - 1) * hs + kd) * 2, value_span = ((heads - 1) * hs + vd) * 2;
    for (long t = 0; t < stride; t += LANES) {
        /* The rows PREFETCH_TILES tiles ahead, a share of the positions per head, keys
         * before the scores and values before the weighing: spread out so, the
         * prefetches overlap the products (all of a tile's rows at once filled the
         * load queue and stalled them: 45% of copy bandwidth against 75%). */
        const long ahead = t + PREFETCH_TILES * LANES;
        for (long h = 0; h < heads; ++h) {
            const long r = h * group, j0 = h * LANES / heads, j1 = (h + 1) * LANES / heads;
            if (ahead < stride) prefetch_rows(c->keys, offsets + ahead, j0, j1, key_span);
            for (long i = 0; i < pairs; i += LANES)
                transpose_pairs((const uint16_t *)c->keys + h * hs, offsets + t, i, kt + i * LANES);
            score_bf16(q + r * pairs, group, pairs, kt, scale, scores);
            for (long g = 0; g < group; ++g)
                softmax_tile(scores + g * LANES, first + t, last, 0, top + r + g, total + (r + g) * LANES,
                             acc + (r + g) * vd, vd);
            if (ahead < stride) prefetch_rows(c->values, offsets + ahead, j0, j1, value_span);
            round_weights(scores, group, w);
            weigh_group((const uint16_t *)c->values + h * hs, offsets + t, vd, w, group, acc + r * vd);
        }
    }
    for (long g = 0; g < rows; ++g) {
        const float sum = lane_sum(loadv(total + g * LANES));
        stats[2 * g] = top[g], stats[2 * g + 1] = sum;
        unpermute_values(acc + g * vd, vd, 1.0f / sum, out + g * vd);
    }
}

/* One head's attention on the fp32-lanes paths (see attend_head and attend_head_chunked). */
static void attend_head_lanes(const struct cache *c, int kv_dtype, const long *offsets, long n, long stride,
                              const float *q, long group, float scale, float *scores, float *acc, float *stats) {
    const int chunked = c->key_dim % CHUNK == 0 && c->value_dim % CHUNK == 0;
    if (chunked && kv_dtype == BF16)
        attend_head_chunked(c, BF16, offsets, n, stride, q, group, scale, scores, acc, stats);
    else if (chunked)
        attend_head_chunked(c, FP32, offsets, n, stride, q, group, scale, scores, acc, stats);
    else if (kv_dtype == BF16)
        attend_head(c, BF16, offsets, n, q, group, scale, scores, acc, stats);
    else
        attend_head(c, FP32, offsets, n, q, group, scale, scores, acc, stats);
}


/* A sequence's visible positions are split into partitions of this many (from its first
 * visible one; a multiple of LANES, so that only the last partition has padding, and of
 * the usual block sizes) where it has more than one partition's worth: each partition is
 * a task, and combine_partitions merges them in order. Whether a sequence is split and
 * where depends on its own length alone, so its bits do not depend on the threads or on
 * the rest of the step; a shorter sequence is one partition, computed as before. */
#define PARTITION 1024

/* A decode sequence of the call: its index, query row, visible positions [first, len),
 * how many partitions they make, and where the first one's rows begin in the partials
 * (in rows of q_heads, when parts > 1). */
struct decode {
    long seq, row, first, len, parts, partials;
};

/* What every task of a call shares. A task is partition `part` of a decode sequence (0
 * for an unsplit one: all its positions) and kv heads [k * task_heads, (k + 1) *
 * task_heads); `units` lists the (decode, partition) pairs, each kv_heads / task_heads
 * tasks. A split sequence's partitions write their normalised fp32 rows to `partials`
 * (value_dim channels each) and their (maximum, sum) pairs to `stats`. */
struct decode_tasks {
    const struct cache *cache;
    const struct rows *rows;
    int kv_dtype;
    const struct decode *decodes;
    const long *units;
    long kv_heads, task_heads;
    const void *block_tables;
    long table_stride;
    int index_bytes;
    long group;
    float scale;
    int bf16;
    float *partials, *stats;
};

/* One task's share of a decode row: kv heads [head, head + heads), visible positions
 * [first, end), and where its rows go: the output rows, or where `partial` is set (a
 * partition of a split sequence) that fp32 row block, their (maximum, sum) to stats. */
struct share {
    long row, head, heads, first, end;
    float *partial, *stats;
};

/* Rows [q_head, q_head + count) of output row `row` from the fp32 rows src (value_dim
 * channels each), in the output dtype. */
static void store_rows(const struct rows *r, long row, long q_head, long count, long vd, const float *src) {
    const long out_size = r->out_dtype == BF16 ? 2 : 4;
    for (long g = 0; g < count; ++g) {
        char *dst = (char *)r->out + (row * r->out_row_stride + (q_head + g) * r->out_head_stride) * out_size;
        for (long i = 0; i < vd; ++i) {
            if (r->out_dtype == BF16)
                ((uint16_t *)dst)[i] = float_to_bf16(src[g * vd + i]);
            else
                ((float *)dst)[i] = src[g * vd + i];
        }
    }
}

/* A share's attention (`table`: its sequence's block table), on the AVX512-BF16 path
 * where the call takes it (see attend_heads_bf16), else head by head on fp32 lanes; 0,
 * or -1 when its scratch could not be allocated. */
static int attend_task(const struct decode_tasks *w, const void *table, const struct share *s) {
    const struct cache *c = w->cache;
    const struct rows *r = w->rows;
    const long kd = c->key_dim, vd = c->value_dim, n = s->end - s->first, group = w->group, rows = s->heads * group;
    const int chunked = kd % CHUNK == 0 && vd % CHUNK == 0, bf16 = w->bf16, kv_dtype = w->kv_dtype;
    /* The chunked and bf16 paths read whole tiles of LANES positions: the padding repeats the last. */
    const long stride = chunked ? (n + LANES - 1) / LANES * LANES : n;
    const long q_size = r->q_dtype == BF16 ? 2 : 4;
    const long bf16_scratch = (kd / 2 + 2 * group) * LANES + rows * (vd + LANES + 1);
    const long scratch = bf16 ? bf16_scratch : group * stride;
    long *offsets = malloc(sizeof(long) * stride + sizeof(float) * (rows * (kd + vd + 2) + scratch));
    if (offsets == NULL) return -1;
    float *q = (float *)(offsets + stride), *acc = q + rows * kd, *scores = acc + rows * vd, *stats = scores + scratch;
    if (s->partial) acc = s->partial, stats = s->stats;
    position_offsets(c, table, w->index_bytes, s->head, s->first, s->end, offsets);
    for (long t = n; t < stride; ++t) offsets[t] = offsets[n - 1];
    for (long g = 0; g < rows; ++g) {
        const char *src = (const char *)r->query + (s->row * r->q_row_stride + (s->head * group + g) * r->q_head_stride) * q_size;
        if (bf16) {
            memcpy((uint32_t *)q + g * (kd / 2), src, kd * 2);
            continue;
        }
        for (long i = 0; i < kd; ++i) q[g * kd + i] = load_one(src, i, r->q_dtype);
        if (chunked) reorder_chunks(q + g * kd, kd, kv_dtype, 0);
    }
    if (bf16)
        attend_heads_bf16(c, offsets, s->first, n, stride, s->heads, (const uint32_t *)q, group, w->scale,
                          (uint32_t *)scores, acc, stats);
    else
        for (long h = 0; h < s->heads; ++h) {
            if (h > 0)
                for (long t = 0; t < stride; ++t) offsets[t] += c->head_stride;
            attend_head_lanes(c, kv_dtype, offsets, n, stride, q + h * group * kd, group, w->scale, scores,
                              acc + h * group * vd, stats + 2 * h * group);
        }
    if (chunked && !bf16)
        for (long g = 0; g < rows; ++g) reorder_chunks(acc + g * vd, vd, kv_dtype, 1);
    if (!s->partial) store_rows(r, s->row, s->head * group, rows, vd, acc);
    free(offsets);
    return 0;
}

/* attend_task for task number `task`. */
static int run_decode_task(const void *tasks, long task) {
    const struct decode_tasks *w = tasks;
    const long per_unit = w->kv_heads / w->task_heads, *unit = w->units + 2 * (task / per_unit);
    const struct decode *d = w->decodes + unit[0];
    const long head = task % per_unit * w->task_heads, first = d->first + unit[1] * PARTITION;
    struct share s = {d->row, head, w->task_heads, first, first + PARTITION < d->len ? first + PARTITION : d->len,
                      NULL, NULL};
    if (d->parts > 1) {
        const long at = (d->partials + unit[1]) * w->kv_heads * w->group + head * w->group;
        s.partial = w->partials + at * w->cache->value_dim, s.stats = w->stats + 2 * at;
    }
    const void *table = (const char *)w->block_tables + d->seq * w->table_stride * w->index_bytes;
    return attend_task(w, table, &s) != 0;
}

/* A split sequence's output rows from its partitions', flash-decoding style: each
 * partition's normalised rows weighed by its sum times e^(its maximum - the greatest
 * maximum), over the sum of those weights, the partitions in ascending order. The weights
 * replace the partitions' sums and the rows are summed in partition 0's. */
static void combine_partitions(const struct decode_tasks *w, const struct decode *d) {
    const long q_heads = w->kv_heads * w->group, vd = w->cache->value_dim, at = d->partials * q_heads;
    float *rows = w->partials + at * vd, *stats = w->stats + 2 * at;
    for (long h = 0; h < q_heads; ++h) {
        float *sum = rows + h * vd, *head_stats = stats + 2 * h;
        float top = head_stats[0], total = 0.0f;
        for (long p = 1; p < d->parts; ++p) top = head_stats[2 * p * q_heads] > top ? head_stats[2 * p * q_heads] : top;
        for (long p = 0; p < d->parts; ++p) {
            float *part = head_stats + 2 * p * q_heads;
            part[1] *= exp_lanes((vfloat){0} + (part[0] - top))[0];
            total += part[1];
        }
        const float inv = 1.0f / total;
        for (long i = 0; i < vd; ++i) sum[i] *= head_stats[1] * inv;
        for (long p = 1; p < d->parts; ++p) {
            const float weight = head_stats[2 * p * q_heads + 1] * inv, *part = rows + p * q_heads * vd + h * vd;
            for (long i = 0; i < vd; ++i) sum[i] += weight * part[i];
        }
    }
    store_rows(w->rows, d->row, 0, q_heads, vd, rows);
}

static void zero_rows(const struct rows *r, long first, long last, long heads, long value_dim) {
    const long esize = r->out_dtype == BF16 ? 2 : 4;
    for (long t = first; t < last; ++t)
        for (long h = 0; h < heads; ++h)
            memset((char *)r->out + (t * r->out_row_stride + h * r->out_head_stride) * esize, 0, value_dim * esize);
}

/* Below this many (position x kv head) pairs in a step, waking a second thread costs
 * more than it saves. */
#define POSITIONS_PER_THREAD 4096

/* struct paged_call: one call's tensors and sizes, every field an int64 (pointers as
 * addresses), passed as one pointer. It is declared once, in _native_attention.py
 * (PAGED_CALL), and the build defines it ahead of this file. Strides are in elements;
 * dtypes are FP32 or BF16; index_bytes is the metadata's width, 4 or 8. */

/* The decode sequences of a varlen step (those with exactly one new query row) into
 * decodes, their partitions counted; how many, or -1 when the metadata points outside
 * the tensors. *prefills gets how many sequences have more than one new row, *positions
 * the decodes' visible positions, *units their partitions, *split_parts those of the
 * sequences split. */
static long find_decodes(const struct paged_call *call, struct decode *decodes, long *prefills, long *positions,
                         long *units, long *split_parts) {
    const void *query_start_loc = (const void *)call->query_start_loc, *seq_lens = (const void *)call->seq_lens;
    const int index_bytes = (int)call->index_bytes;
    const long block_size = call->block_size, window = call->sliding_window;
    long count = 0;
    *prefills = *positions = *units = *split_parts = 0;
    for (long b = 0; b < call->num_seqs; ++b) {
        const long start = read_index(query_start_loc, b, index_bytes);
        const long q_len = read_index(query_start_loc, b + 1, index_bytes) - start;
        const long len = read_index(seq_lens, b, index_bytes);
        if (q_len > 1) ++*prefills;
        if (q_len != 1) continue;
        const long first = window > 0 && len > window ? len - window : 0;
        const long blocks = (len + block_size - 1) / block_size;
        if (start < 0 || start >= call->rows || len < 1 || blocks > call->table_width) return -1;
        const void *table = (const char *)call->block_tables + b * call->table_stride * index_bytes;
        for (long k = first / block_size; k < blocks; ++k) {
            const long block = read_index(table, k, index_bytes);
            if (block < 0 || block >= call->num_blocks) return -1;
        }
        const long parts = (len - first + PARTITION - 1) / PARTITION;
        decodes[count++] = (struct decode){b, start, first, len, parts, *split_parts};
        *positions += len - first;
        *units += parts;
        if (parts > 1) *split_parts += parts;
    }
    return count;
}

/* The decode rows of a varlen step (see the paged_attention contract), and zeros in the
 * query rows no sequence owns. Returns how many sequences have more than one new row
 * (left to the caller), or -1 when the metadata points outside the tensors (having
 * written nothing: the caller's checked path then reports it) or memory ran out (the
 * caller's path then redoes the whole call). `isa` picks the path: ISA_AVX512_BF16 (where
 * the call and the CPU allow it, else the fp32 lanes) or ISA_FP32. */
long accord_paged_decode_attention(const struct paged_call *call, float scale, long isa) {
    const int index_bytes = (int)call->index_bytes, kv_dtype = (int)call->kv_dtype;
    const long rows = call->rows, q_heads = call->q_heads, kv_heads = call->kv_heads, value_dim = call->value_dim,
               threads = call->threads;
    const long owned_first = read_index((const void *)call->query_start_loc, 0, index_bytes);
    const long owned_last = read_index((const void *)call->query_start_loc, call->num_seqs, index_bytes);
    if (owned_first < 0 || owned_last > rows || owned_first > owned_last) return -1;
    struct decode *decodes = malloc(sizeof *decodes * (call->num_seqs + 1));
    if (decodes == NULL) return -1;
    long prefills, positions, units, split_parts;
    const long count = find_decodes(call, decodes, &prefills, &positions, &units, &split_parts);
    if (count < 0) {
        free(decodes);
        return -1;
    }
    /* The (decode, partition) pairs, then the split sequences' partial rows and stats. */
    const long split_rows = split_parts * q_heads;
    long *unit_list = malloc(sizeof(long) * 2 * (units + 1) + sizeof(float) * split_rows * (value_dim + 2));
    if (unit_list == NULL) {
        free(decodes);
        return -1;
    }
    for (long d = 0, u = 0; d < count; ++d)
        for (long p = 0; p < decodes[d].parts; ++p, ++u) unit_list[2 * u] = d, unit_list[2 * u + 1] = p;
    float *partials = (float *)(unit_list + 2 * (units + 1)), *stats = partials + split_rows * value_dim;
    const struct cache c = {(const void *)call->key_cache, (const void *)call->value_cache, call->block_stride,
                            call->slot_stride, call->head_stride, call->block_size, call->key_dim, value_dim};
    const struct rows r = {(const void *)call->query, (void *)call->out, (int)call->q_dtype, (int)call->out_dtype,
                           call->q_row_stride, call->q_head_stride, call->out_row_stride, call->out_head_stride};
    zero_rows(&r, 0, owned_first, q_heads, value_dim);
    zero_rows(&r, owned_last, rows, q_heads, value_dim);
    /* A task per partition over all its sequence's kv heads (its rows read in order,
     * whole) where there are partitions enough to share among the threads, else per
     * (partition, kv head). Each head's result is the same either way. */
    const long task_heads = units >= threads ? kv_heads : 1;
    const long tasks = units * (kv_heads / task_heads), group = q_heads / kv_heads;
    long wanted = positions * kv_heads / POSITIONS_PER_THREAD;
    if (wanted > threads) wanted = threads;
    if (wanted > tasks) wanted = tasks;
    if (wanted < 1) wanted = 1;
    /* The AVX512-BF16 path takes bf16 query and caches of widths in whole vectors of pairs. */
    const int bf16 = isa == ISA_AVX512_BF16 && call->q_dtype == BF16 && kv_dtype == BF16 && call->key_dim % 32 == 0 &&
                     value_dim % 32 == 0 && __builtin_cpu_supports("avx512bf16");
    const struct decode_tasks work = {&c, &r, kv_dtype, decodes, unit_list, kv_heads, task_heads,
                                      (const void *)call->block_tables, call->table_stride, index_bytes, group, scale,
                                      bf16, partials, stats};
    const int failed = run_tasks(run_decode_task, &work, tasks, wanted);
    if (!failed)
        for (long d = 0; d < count; ++d)
            if (decodes[d].parts > 1) combine_partitions(&work, &decodes[d]);
    free(unit_list);
    free(decodes);
    return failed ? -1 : prefills;
}
