/* y[M, N] = x[M, K] @ W[N, K]^T (+ bias[N]) with fp32 x, y, bias and bf16 W: each weight
 * element is widened to fp32 exactly (a bf16 is the top half of an fp32), multiplied and
 * accumulated in fp32, so the result is the fp32 GEMM's up to summation order while the
 * weights stream at half the bytes. Made for few rows (decode), where the GEMM is bound
 * by the weight stream; built by _native_gemm.py with -march=native, so GCC's vector
 * extensions below become AVX512 or AVX2 code as the host allows.
 *
 * Work split: a block is ROWS_PER_BLOCK weight rows; inside a block, x is taken TILE_M
 * rows at a time so the block's weights (a few KiB, in L1) are read from memory once
 * whatever M is. Threads take chunks of consecutive blocks (about CHUNK_BYTES of weights)
 * from a shared counter rather than a fixed half each: the work of a thread the OS runs
 * late (a busy host) or that wakes late goes to the others, so the call waits only for
 * that thread to reach the region's end, not for it to do half the weights. Every output element is computed by the same code whichever thread runs it,
 * so the result does not depend on the split (batch invariance).
 *
 * Prefetch: while a block is computed its successor in the chunk is prefetched into L2,
 * a cache line per 64 bytes the block consumes. The hardware prefetchers do not follow
 * a block's ROWS_PER_BLOCK short interleaved row streams well (a row of a 1024-wide
 * weight is 2 KiB); with the software prefetch one thread streamed a decode step's
 * weights of the 152M bench Llama (12 x qkv, o, gate_up, down, and the LM head; 1 and 4
 * rows) 1.2-1.3x faster on a 2-core AVX512 Xeon. Prefetching into L1 instead, or two or
 * four blocks ahead, measured no better. */

#include <stdint.h>
#include <string.h>

#define LANES 16
#define ROWS_PER_BLOCK 4
#define TILE_M 4
#define CHUNK_BYTES (64 * 1024)

typedef float vfloat __attribute__((vector_size(LANES * 4)));
typedef uint32_t vuint __attribute__((vector_size(LANES * 4)));
typedef uint16_t vhalf __attribute__((vector_size(LANES * 2)));

static inline vfloat load_floats(const float *p) {
    vfloat v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Sixteen bf16 values widened to fp32: the bf16 bits become the high half. */
static inline vfloat load_bf16(const uint16_t *p) {
    vhalf h;
    memcpy(&h, p, sizeof h);
    vuint wide = __builtin_convertvector(h, vuint) << 16;
    vfloat v;
    memcpy(&v, &wide, sizeof v);
    return v;
}

static inline float bf16_scalar(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float lane_sum(vfloat v) {
    float s = 0.0f;
    for (int j = 0; j < LANES; ++j) s += v[j];
    return s;
}

/* rows weight rows [n0, n0 + rows) against tile_m x rows [m0, m0 + tile_m); both counts
 * are compile-time constants where this is inlined, so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile(
    const float *x, const uint16_t *w, const float *bias, float *y, long K, long ldx, long ldy,
    long m0, long n0, const int rows, const int tile_m, const char *next) {
    vfloat acc[TILE_M][ROWS_PER_BLOCK];
    for (int m = 0; m < tile_m; ++m)
        for (int r = 0; r < rows; ++r) acc[m][r] = (vfloat){0};
    long k = 0;
    for (; k + LANES <= K; k += LANES) {
        /* The next block is as many bytes as this one: fetch the same share of it. */
        if (next)
            for (int line = 0; line < rows * LANES * 2; line += 64) __builtin_prefetch(next + k * 2 * rows + line, 0, 2);
        vfloat wv[ROWS_PER_BLOCK];
        for (int r = 0; r < rows; ++r) wv[r] = load_bf16(w + (n0 + r) * K + k);
        for (int m = 0; m < tile_m; ++m) {
            vfloat xv = load_floats(x + (m0 + m) * ldx + k);
            for (int r = 0; r < rows; ++r) acc[m][r] += xv * wv[r];
        }
    }
    for (int m = 0; m < tile_m; ++m) {
        for (int r = 0; r < rows; ++r) {
            float s = lane_sum(acc[m][r]);
            for (long t = k; t < K; ++t) s += x[(m0 + m) * ldx + t] * bf16_scalar(w[(n0 + r) * K + t]);
            if (bias) s += bias[n0 + r];
            y[(m0 + m) * ldy + n0 + r] = s;
        }
    }
}

/* One tile with its row counts as constants (tile_m is 1..TILE_M at run time). */
#define TILE_CASES(n, rows, next)                                                  \
    switch (tile_m) {                                                              \
    case 1: tile(x, w, bias, y, K, ldx, ldy, m0, n, rows, 1, next); break;         \
    case 2: tile(x, w, bias, y, K, ldx, ldy, m0, n, rows, 2, next); break;         \
    case 3: tile(x, w, bias, y, K, ldx, ldy, m0, n, rows, 3, next); break;         \
    default: tile(x, w, bias, y, K, ldx, ldy, m0, n, rows, 4, next); break;        \
    }

void accord_bf16_weight_gemm(
    const float *x, const uint16_t *w, const float *bias, float *y,
    long M, long N, long K, long ldx, long ldy, int threads) {
    long blocks = (N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    long per_chunk = CHUNK_BYTES / (ROWS_PER_BLOCK * K * 2);
    if (per_chunk < 1) per_chunk = 1;
    long chunks = (blocks + per_chunk - 1) / per_chunk;
#pragma omp parallel for schedule(dynamic, 1) num_threads(chunks < threads ? (int)chunks : threads)
    for (long c = 0; c < chunks; ++c) {
        long end = (c + 1) * per_chunk < blocks ? (c + 1) * per_chunk : blocks;
        for (long b = c * per_chunk; b < end; ++b) {
            long n0 = b * ROWS_PER_BLOCK;
            long rows = N - n0 < ROWS_PER_BLOCK ? N - n0 : ROWS_PER_BLOCK;
            /* The next whole block of this chunk, fetched during the first x tile. */
            const char *next = b + 1 < end && n0 + 2 * ROWS_PER_BLOCK <= N ? (const char *)(w + (n0 + ROWS_PER_BLOCK) * K) : 0;
            for (long m0 = 0; m0 < M; m0 += TILE_M) {
                int tile_m = M - m0 < TILE_M ? (int)(M - m0) : TILE_M;
                const char *fetch = m0 == 0 ? next : 0;
                if (rows == ROWS_PER_BLOCK) {
                    TILE_CASES(n0, ROWS_PER_BLOCK, fetch)
                } else {
                    for (long n = n0; n < n0 + rows; ++n) TILE_CASES(n, 1, 0)
                }
            }
        }
    }
}

/* dst = the high halves (bf16 bits) of the n fp32 values at src; returns 1 when every
 * low half is zero, i.e. the values are exactly bf16 and dst loses nothing, else 0.
 * One pass and no temporaries: it runs over every weight at load. */
int accord_exact_bf16(const uint32_t *src, uint16_t *dst, long n, int threads) {
    uint32_t low = 0;
#pragma omp parallel for schedule(static) reduction(| : low) num_threads(threads)
    for (long i = 0; i < n; ++i) {
        dst[i] = (uint16_t)(src[i] >> 16);
        low |= src[i] & 0xFFFFu;
    }
    return low == 0;
}
