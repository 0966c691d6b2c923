/* Batched multi-LoRA (Punica's BGMV): out[t] = y[t] + (x[t] @ A[s]^T) @ B[s]^T with
 * s = slots[t] (-1: out[t] = y[t]), for every token of a batch in one call, whatever mix
 * of adapters the batch holds. The tokens are grouped by slot first (a counting sort), so
 * each slot's A and B are read once per block of its tokens rather than once per token;
 * then one shrink over every token (h[t] = A[s] x[t], R fp32 values, a dot over K per
 * rank), then one expand (out[t] = y[t] + h[t] @ B[s], B being [R, N], PEFT's B
 * transposed: each rank's row of outputs is read contiguously and added LANES columns
 * at a time, with no horizontal sums). Both are fp32 sums of exact products: a bf16
 * operand is widened exactly (its bits are the high half of an fp32); on a CPU with
 * AVX512-BF16 the shrink of bf16 x by bf16 A may instead run on vdpbf16ps (`path` 1),
 * which multiplies bf16 pairs exactly and adds in fp32, in another order. The sum with
 * y is rounded once to y's dtype (to nearest even for bf16).
 *
 * Work items are (slot group, block of up to TOKEN_BLOCK of its tokens) for the shrink and
 * (slot group, token block, block of OUT_BLOCK output columns) for the expand, spread over
 * OpenMP threads. Every output element is computed by the same code in the same order
 * whichever item or thread holds it and whichever tokens share its block (each token has
 * its own accumulators), so a token's result does not depend on its batch mates (batch
 * invariance) nor on the thread count.
 *
 * Built by _native_lora.py with -march=native: GCC's vector extensions below become
 * AVX512 or AVX2 code as the host allows (plain C elsewhere). */

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define HAVE_DPBF16 1
#else
#define HAVE_DPBF16 0
#endif
#include "bf16.h"
#include "lanes.h"

#define TOKEN_BLOCK 4
#define OUT_BLOCK 64
/* Multiply-adds below which a call runs on the calling thread: waking the OpenMP team
 * costs more than a decode row's few of them. */
#define PARALLEL_WORK (1L << 17)

/* out[at] (holding y) += delta, rounded once to out's dtype. */
static inline void add_out(void *out, long at, float delta, int bf16) {
    if (bf16) {
        uint16_t *o = out;
        o[at] = float_to_bf16(bf16_to_float(o[at]) + delta);
    } else {
        ((float *)out)[at] += delta;
    }
}

/* dots[j] = u[j] . v over `len` elements for `count` (1..TOKEN_BLOCK) vectors u[j], all
 * against one v read once; u and v fp32 or bf16 as said. Each dot has its own
 * accumulator and order, so it does not depend on `count` or on its neighbours. */
static inline __attribute__((always_inline)) void block_dots(
    const void *const *u, int u_bf16, const void *v, int v_bf16, long len, int count, float *dots) {
    vfloat acc[TOKEN_BLOCK];
    for (int j = 0; j < count; ++j) acc[j] = (vfloat){0};
    long i = 0;
    for (; i + LANES <= len; i += LANES) {
        vfloat vv = load_lanes(v, i, v_bf16);
        for (int j = 0; j < count; ++j) acc[j] += load_lanes(u[j], i, u_bf16) * vv;
    }
    for (int j = 0; j < count; ++j) {
        float sum = lane_sum(acc[j]);
        for (long k = i; k < len; ++k) sum += load_one(u[j], k, u_bf16) * load_one(v, k, v_bf16);
        dots[j] = sum;
    }
}

#if HAVE_DPBF16
/* block_dots for bf16 u and v on vdpbf16ps: 32 bf16 products per instruction, each pair
 * summed into one fp32 lane; the tail is widened as above. */
static inline __attribute__((always_inline)) void block_dots_dpbf16(
    const void *const *u, const void *v, long len, int count, float *dots) {
    __m512 acc[TOKEN_BLOCK];
    for (int j = 0; j < count; ++j) acc[j] = _mm512_setzero_ps();
    long i = 0;
    for (; i + 2 * LANES <= len; i += 2 * LANES) {
        __m512bh vv = (__m512bh)_mm512_loadu_si512((const uint16_t *)v + i);
        for (int j = 0; j < count; ++j)
            acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)_mm512_loadu_si512((const uint16_t *)u[j] + i), vv);
    }
    for (int j = 0; j < count; ++j) {
        float sum = _mm512_reduce_add_ps(acc[j]);
        for (long k = i; k < len; ++k) sum += load_one(u[j], k, 1) * load_one(v, k, 1);
        dots[j] = sum;
    }
}
#endif

#if HAVE_DPBF16
#define SHRINK(n)                                                       \
    do {                                                                \
        if (path == 1)                                                  \
            block_dots_dpbf16(rows, a_row, K, n, dots);                 \
        else                                                            \
            block_dots(rows, bf16, a_row, bf16, K, n, dots);            \
    } while (0)
#else
#define SHRINK(n) block_dots(rows, bf16, a_row, bf16, K, n, dots)
#endif

/* out[t[j], n] += h[t[j]] . B[:, n] for the count tokens t[j] and the OUT_BLOCK columns
 * from n0 (all inside N), B being one slot's [R, N]: each of R rank rows is read once for
 * the tokens together, its columns LANES at a time, times each token's h broadcast; a
 * column's sum runs over r in order, one fused multiply-add per rank. */
static inline __attribute__((always_inline)) void expand_block(
    const char *b, const float *h, const long *t, void *out, long N, long R, long n0, int bf16, const int count) {
    enum { VECS = OUT_BLOCK / LANES };
    vfloat acc[TOKEN_BLOCK][VECS];
    for (int j = 0; j < count; ++j)
        for (int c = 0; c < VECS; ++c) acc[j][c] = (vfloat){0};
    for (long r = 0; r < R; ++r) {
        vfloat bv[VECS];
        for (int c = 0; c < VECS; ++c) bv[c] = load_lanes(b, r * N + n0 + c * LANES, bf16);
        for (int j = 0; j < count; ++j) {
            vfloat hv = (vfloat){0} + h[t[j] * R + r];
            for (int c = 0; c < VECS; ++c) acc[j][c] += hv * bv[c];
        }
    }
    for (int j = 0; j < count; ++j)
        for (int c = 0; c < VECS; ++c)
            for (int l = 0; l < LANES; ++l) add_out(out, t[j] * N + n0 + c * LANES + l, acc[j][c][l], bf16);
}

/* expand_block for the last, partial block of columns [n0, N): the same sums, one
 * column at a time. */
static void expand_tail(const char *b, const float *h, const long *t, void *out, long N, long R, long n0, int bf16,
                        int count) {
    for (long n = n0; n < N; ++n)
        for (int j = 0; j < count; ++j) {
            float sum = 0;
            for (long r = 0; r < R; ++r) sum += h[t[j] * R + r] * load_one(b, r * N + n, bf16);
            add_out(out, t[j] * N + n, sum, bf16);
        }
}

/* Bit i set: path i is built here (0: widening fp32 FMAs, always; 1: vdpbf16ps). */
int accord_lora_paths(void) { return 1 | (HAVE_DPBF16 << 1); }

/* out [T, N] = y [T, N] + the delta of each token's slot, as above. x [T, K] has row
 * stride ldx, everything else is contiguous: A [S, R, K], B [S, R, N], slots int32 [T],
 * y and out of one dtype. `bf16` says all of y, x, A, B and out are bf16 (else fp32);
 * `path` picks the shrink's dot (1 only where built and bf16). Returns 0; 1 for a slot
 * outside [-1, S) (nothing written); 2 for a path not built here; 3 when scratch memory
 * could not be had. */
int accord_lora_linear(const void *y, const void *x, const void *a, const void *b, const int32_t *slots, void *out,
                       long T, long K, long N, long R, long S, long ldx, int bf16, int path, int threads) {
    if (path == 1 && !(HAVE_DPBF16 && bf16)) return 2;
    for (long t = 0; t < T; ++t)
        if (slots[t] < -1 || slots[t] >= S) return 1;
    const long elem = bf16 ? 2 : 4;
    memcpy(out, y, (size_t)(T * N * elem));
    /* Counting sort of the adapter tokens by slot: group g is order[start[g] .. start[g + 1]). */
    long *count = calloc((size_t)S + 1, sizeof *count);
    long *order = malloc((size_t)(T > 0 ? T : 1) * sizeof *order);
    float *h = malloc((size_t)(T > 0 ? T * R : 1) * sizeof *h);
    if (!count || !order || !h) {
        free(count), free(order), free(h);
        return 3;
    }
    for (long t = 0; t < T; ++t)
        if (slots[t] >= 0) count[slots[t] + 1]++;
    for (long s = 0; s < S; ++s) count[s + 1] += count[s];
    long *next = malloc((size_t)(S > 0 ? S : 1) * sizeof *next);
    if (!next) {
        free(count), free(order), free(h);
        return 3;
    }
    memcpy(next, count, (size_t)S * sizeof *next);
    for (long t = 0; t < T; ++t)
        if (slots[t] >= 0) order[next[slots[t]]++] = t;
    free(next);
    const long adapter_tokens = count[S];
    /* Token blocks of every group, in group order: block i starts at order[first[i]]. */
    long blocks = 0;
    for (long s = 0; s < S; ++s) blocks += (count[s + 1] - count[s] + TOKEN_BLOCK - 1) / TOKEN_BLOCK;
    long *first = malloc((size_t)(blocks > 0 ? blocks : 1) * 2 * sizeof *first);
    if (!first) {
        free(count), free(order), free(h);
        return 3;
    }
    long *block_slot = first + blocks;
    for (long s = 0, i = 0; s < S; ++s)
        for (long at = count[s]; at < count[s + 1]; at += TOKEN_BLOCK, ++i) first[i] = at, block_slot[i] = s;
    const int team = adapter_tokens * R * (K + N) >= PARALLEL_WORK ? threads : 1;
    const long col_blocks = (N + OUT_BLOCK - 1) / OUT_BLOCK;

#pragma omp parallel num_threads(team)
    {
#pragma omp for schedule(dynamic)
        for (long i = 0; i < blocks; ++i) { /* the shrink: h[t, r] = x[t] . A[s, r] */
            long s = block_slot[i], end = count[s + 1];
            int n_tok = (int)(end - first[i] < TOKEN_BLOCK ? end - first[i] : TOKEN_BLOCK);
            const void *rows[TOKEN_BLOCK];
            for (int j = 0; j < n_tok; ++j)
                rows[j] = (const char *)x + order[first[i] + j] * ldx * elem;
            float dots[TOKEN_BLOCK];
            for (long r = 0; r < R; ++r) {
                const void *a_row = (const char *)a + (s * R + r) * K * elem;
                switch (n_tok) { /* constant counts: the accumulators stay in registers */
                case 1: SHRINK(1); break;
                case 2: SHRINK(2); break;
                case 3: SHRINK(3); break;
                default: SHRINK(TOKEN_BLOCK); break;
                }
                for (int j = 0; j < n_tok; ++j) h[order[first[i] + j] * R + r] = dots[j];
            }
        }
        /* (the loop's implied barrier: the expand reads every h) */
#pragma omp for schedule(dynamic)
        for (long item = 0; item < blocks * col_blocks; ++item) { /* out[t, n0:n1] += h[t] @ B[s][:, n0:n1] */
            long i = item / col_blocks, n0 = item % col_blocks * OUT_BLOCK;
            long s = block_slot[i], end = count[s + 1];
            int n_tok = (int)(end - first[i] < TOKEN_BLOCK ? end - first[i] : TOKEN_BLOCK);
            long t[TOKEN_BLOCK];
            for (int j = 0; j < n_tok; ++j) t[j] = order[first[i] + j];
            const char *b_slot = (const char *)b + s * R * N * elem;
            if (n0 + OUT_BLOCK <= N) {
                switch (n_tok) {
                case 1: expand_block(b_slot, h, t, out, N, R, n0, bf16, 1); break;
                case 2: expand_block(b_slot, h, t, out, N, R, n0, bf16, 2); break;
                case 3: expand_block(b_slot, h, t, out, N, R, n0, bf16, 3); break;
                default: expand_block(b_slot, h, t, out, N, R, n0, bf16, TOKEN_BLOCK); break;
                }
            } else {
                expand_tail(b_slot, h, t, out, N, R, n0, bf16, n_tok);
            }
        }
    }
    free(first), free(count), free(order), free(h);
    return 0;
}
