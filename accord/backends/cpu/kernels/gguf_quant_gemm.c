/* The quantised linear on GGUF blocks as stored (quant_linear): weights stay packed, and
 * each block is unpacked once per call into int8 codes with a float scale and min per 16
 * weights (value = scale * code - min), which every format reduces to. Activations are
 * quantised to int8 per 32-wide block, as ggml's Q8 dot products do them, with each
 * 16-group's code sum kept for the mins. Dot products of 32 codes run on AVX-VNNI /
 * AVX512-VNNI (vpdpbusd), on AVX2 (vpmaddubsw + vpmaddwd), or in plain C: `path` picks
 * one of those compiled for this host (accord_gguf_paths says which), so tests force
 * each. OpenMP splits the output rows statically: every row costs the same, and a
 * dynamic split's chunk hand-out made a 2-thread decode step slower than 1 thread
 * (benchmarks/quant_gguf_cpu.py, 2-core EPYC KVM guest). accord_gguf_dequantize
 * writes rows as fp32, for the many-rows path that hands them to a GEMM, and
 * accord_gguf_embedding looks up a packed token embedding's rows.
 */
#include "bf16.h"
#include "gguf_blocks.h"
#include "gguf_token_tile.h"

/* Most tokens one call's dot path takes (the caller splits larger calls). */
#define MAX_TOKENS 16
/* Sum over two 16-groups of scale_g * dot(w, x) for 32 codes: the plain path. */
static inline float dot32_plain(const int8_t *w, const int8_t *x, float scale0, float scale1) {
    int s0 = 0, s1 = 0;
    for (int i = 0; i < 16; i++) s0 += w[i] * x[i];
    for (int i = 16; i < 32; i++) s1 += w[i] * x[i];
    return scale0 * s0 + scale1 * s1;
}

#if defined(__AVX2__)
/* The 8 int32 lanes of a 32-code dot of unsigned codes u with signed codes x: lanes 0-3
 * hold the first 16 codes' partial sums, lanes 4-7 the second's (vpdpbusd on VNNI,
 * vpmaddubsw + vpmaddwd on AVX2). */
static inline __m256i unsigned_lanes(int path, __m256i u, __m256i x) {
#if defined(HAVE_VNNI)
    if (path == PATH_VNNI) return dpbusd(_mm256_setzero_si256(), u, x);
#endif
    (void)path;
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

/* The same dot for signed codes w: the weight's sign moves onto the activation
 * (|w| * sign(w) x). */
static inline __m256i signed_lanes(int path, __m256i w, __m256i x) {
    return unsigned_lanes(path, _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

/* The formats whose 32-code blocks decode straight into a vector (vector_codes). */
#define HAS_VECTOR_CODES(fmt) ((fmt) == Q8_0 || (fmt) == Q4_0 || (fmt) == Q4_1)

/* The 32 codes of a HAS_VECTOR_CODES block in a vector (no unpacking through memory),
 * with the block's one scale and offset (value = scale * code + offset). Nibbles stay
 * unsigned (Q4_0's -8 moves into the offset), so their dot needs no sign fix;
 * `is_signed` says which. */
static inline void vector_codes(int fmt, const uint8_t *b, __m256i *codes, float *scale, float *offset, int *is_signed) {
    *scale = half(b);
    if (fmt == Q8_0) {
        *codes = _mm256_loadu_si256((const __m256i *)(b + 2));
        *offset = 0.0f;
        *is_signed = 1;
        return;
    }
    *codes = nibbles(b + (fmt == Q4_0 ? 2 : 4));
    *offset = fmt == Q4_0 ? -8.0f * *scale : half(b + 2);
    *is_signed = 0;
}
#endif

/* Which paths this build has: bit p set for path p. */
int accord_gguf_paths(void) {
    int paths = 1 << PATH_PLAIN;
#if defined(__AVX2__)
    paths |= 1 << PATH_AVX2;
#endif
#if defined(HAVE_VNNI)
    paths |= 1 << PATH_VNNI;
#endif
    return paths;
}

#if defined(__AVX2__)
static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#if defined(__AVX2__)
/* One block of a format with vector codes, dotted with each token's codes, into the
 * accumulators given: the vector sums of scaled lanes and the scalar offset terms. */
static inline __attribute__((always_inline)) void vector_block(
    int fmt, int path, const uint8_t *b, long block, long depth, int tokens, const int8_t *xq, const float *xs,
    const float *xsum, __m256 *vacc, float *sums
) {
    __m256i w;
    float d, offset;
    int is_signed;
    vector_codes(fmt, b, &w, &d, &offset, &is_signed);
    for (int t = 0; t < tokens; t++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(xq + t * depth + block * 32));
        __m256i lanes = is_signed ? signed_lanes(path, w, v) : unsigned_lanes(path, w, v);
        const float *sum16 = xsum + t * (depth / 16) + block * 2;
        sums[t] += offset * (sum16[0] + sum16[1]);
        vacc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(d * xs[t * (depth / 32) + block]), vacc[t]);
    }
}
#endif

/* One output row for every token: block by block, unpacked once, dotted with each
 * token's codes. Always inlined, so that a call with a constant token count (the single
 * token of a decode step) keeps its accumulators in registers: with a runtime count
 * they live on the stack, and each block waits on a store and a reload of them. Blocks
 * that decode straight into a vector alternate between two sets of accumulators, so
 * consecutive blocks do not wait on each other's additions. */
static inline __attribute__((always_inline)) void row_dot(
    int fmt, int path, const uint8_t *row, long blocks, long depth, int tokens, const int8_t *xq, const float *xs,
    const float *xsum, float *acc
) {
    int bs = BLOCK_SIZE[fmt];
    float sums[2][MAX_TOKENS];
    for (int t = 0; t < tokens; t++) sums[0][t] = sums[1][t] = 0.0f;
#if defined(__AVX2__)
    __m256 vacc[2][MAX_TOKENS];
    for (int t = 0; t < tokens; t++) vacc[0][t] = vacc[1][t] = _mm256_setzero_ps();
    if (path != PATH_PLAIN && HAS_VECTOR_CODES(fmt)) {
        long block = 0, stride = BLOCK_BYTES[fmt];
        for (; block + 1 < blocks; block += 2) {
            vector_block(fmt, path, row + block * stride, block, depth, tokens, xq, xs, xsum, vacc[0], sums[0]);
            vector_block(fmt, path, row + (block + 1) * stride, block + 1, depth, tokens, xq, xs, xsum, vacc[1], sums[1]);
        }
        if (block < blocks)
            vector_block(fmt, path, row + block * stride, block, depth, tokens, xq, xs, xsum, vacc[0], sums[0]);
        for (int t = 0; t < tokens; t++) acc[t] = sums[0][t] + sums[1][t] + hsum(_mm256_add_ps(vacc[0][t], vacc[1][t]));
        return;
    }
#endif
    unpacked u;
    for (long block = 0; block < blocks; block++) {
        unpack(fmt, row + block * BLOCK_BYTES[fmt], &u);
        long first = block * bs;
        for (int t = 0; t < tokens; t++) {
            const int8_t *x = xq + t * depth + first;
            const float *scale = xs + t * (depth / 32) + first / 32, *sum16 = xsum + t * (depth / 16) + first / 16;
            float minus = 0.0f;
            for (int g = 0; g < bs / 16; g++) minus += u.min[g] * sum16[g];
            sums[0][t] -= minus;
            for (int c = 0; c < bs / 32; c++) {
                float s0 = u.scale[2 * c] * scale[c], s1 = u.scale[2 * c + 1] * scale[c];
                if (path == PATH_PLAIN) {
                    sums[0][t] += dot32_plain(u.q + 32 * c, x + 32 * c, s0, s1);
                    continue;
                }
#if defined(__AVX2__)
                __m256i lanes = signed_lanes(path, _mm256_loadu_si256((const __m256i *)(u.q + 32 * c)),
                                             _mm256_loadu_si256((const __m256i *)(x + 32 * c)));
                __m256 scales = _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0));
                vacc[c & 1][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), scales, vacc[c & 1][t]);
#endif
            }
        }
    }
    for (int t = 0; t < tokens; t++) {
        acc[t] = sums[0][t];
#if defined(__AVX2__)
        if (path != PATH_PLAIN) acc[t] += hsum(_mm256_add_ps(vacc[0][t], vacc[1][t]));
#endif
    }
}

/* row_dot for the one token of a decode step, inlined with the format a constant for
 * the common formats (the three that decode straight into a vector, and the K-quants
 * of Q4_K_M-style files): the block loop then carries no format dispatch and keeps its
 * pointers and accumulators in registers. The rarer formats share one runtime-format
 * copy. */
static void row_dot_one_token(
    int fmt, int path, const uint8_t *row, long blocks, long depth, const int8_t *xq, const float *xs,
    const float *xsum, float *acc
) {
    switch (fmt) {
    case Q8_0: row_dot(Q8_0, path, row, blocks, depth, 1, xq, xs, xsum, acc); return;
    case Q4_0: row_dot(Q4_0, path, row, blocks, depth, 1, xq, xs, xsum, acc); return;
    case Q4_1: row_dot(Q4_1, path, row, blocks, depth, 1, xq, xs, xsum, acc); return;
    case Q4_K: row_dot(Q4_K, path, row, blocks, depth, 1, xq, xs, xsum, acc); return;
    case Q5_K: row_dot(Q5_K, path, row, blocks, depth, 1, xq, xs, xsum, acc); return;
    case Q6_K: row_dot(Q6_K, path, row, blocks, depth, 1, xq, xs, xsum, acc); return;
    default: row_dot(fmt, path, row, blocks, depth, 1, xq, xs, xsum, acc);
    }
}

/* out [tokens, rows] fp32 = x [tokens, depth] fp32 @ W^T (+ bias fp32), W the packed
 * rows of `fmt`, by the row dot (`tiled` 0, at most MAX_TOKENS tokens) or the token-tile
 * GEMM (`tiled` 1, any number); scratch holds tokens * (depth + depth / 32 * 4 + depth /
 * 16 * 4) bytes. Returns 0, or -1 for an unknown format, path or token count (or a panel
 * that could not be allocated). */
int accord_gguf_linear(
    const float *x, const uint8_t *weight, const float *bias, float *out, long tokens, long rows, long depth, int fmt,
    int path, int tiled, void *scratch, int threads
) {
    if (fmt < Q8_0 || fmt > Q6_K || !(accord_gguf_paths() >> path & 1) || tokens < 1 || (!tiled && tokens > MAX_TOKENS))
        return -1;
    int8_t *xq = (int8_t *)scratch;
    float *xs = (float *)(xq + tokens * depth), *xsum = xs + tokens * (depth / 32);
#pragma omp parallel for num_threads(threads) schedule(static) if (tokens > 1)
    for (long t = 0; t < tokens; t++)
        quantize_activations(x + t * depth, depth, xq + t * depth, xs + t * (depth / 32), xsum + t * (depth / 16));
    if (tiled) return token_tile_gemm(weight, bias, out, tokens, rows, depth, fmt, path, xq, xs, xsum, threads);
    long blocks = depth / BLOCK_SIZE[fmt], row_bytes = blocks * BLOCK_BYTES[fmt];
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long n = 0; n < rows; n++) {
        float acc[MAX_TOKENS];
        if (tokens == 1)
            row_dot_one_token(fmt, path, weight + n * row_bytes, blocks, depth, xq, xs, xsum, acc);
        else
            row_dot(fmt, path, weight + n * row_bytes, blocks, depth, (int)tokens, xq, xs, xsum, acc);
        for (long t = 0; t < tokens; t++) out[t * rows + n] = acc[t] + (bias ? bias[n] : 0.0f);
    }
    return 0;
}

/* One block's weights as fp32 at dst. */
static inline void dequantize_block(int fmt, const uint8_t *block, float *dst) {
    unpacked u;
    unpack(fmt, block, &u);
    /* Group by group, so the compiler vectorises the 16 conversions of each. */
    for (int g = 0; g < BLOCK_SIZE[fmt] / 16; g++) {
        float scale = u.scale[g], min = u.min[g];
        for (int i = 0; i < 16; i++) dst[16 * g + i] = scale * u.q[16 * g + i] - min;
    }
}

/* Rows [first, first + count) of the packed weight as fp32 [count, depth]. */
int accord_gguf_dequantize(const uint8_t *weight, float *out, long first, long count, long depth, int fmt, int threads) {
    if (fmt < Q8_0 || fmt > Q6_K) return -1;
    int bs = BLOCK_SIZE[fmt];
    long blocks = depth / bs, row_bytes = blocks * BLOCK_BYTES[fmt];
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long n = 0; n < count; n++)
        for (long block = 0; block < blocks; block++)
            dequantize_block(fmt, weight + (first + n) * row_bytes + block * BLOCK_BYTES[fmt], out + n * depth + block * bs);
    return 0;
}

/* The embedding lookup: row ids[t] of the packed table [rows, depth] as out[t], fp32,
 * or bf16 (rounded once from the fp32 values) where `bf16_out`. An id outside the
 * table returns -2 before anything is written. A few rows are looked up per step, so
 * one thread does it: a parallel region would cost more than the rows. */
int accord_gguf_embedding(const uint8_t *weight, const int64_t *ids, void *out, long tokens, long rows, long depth,
                          int fmt, int bf16_out) {
    if (fmt < Q8_0 || fmt > Q6_K) return -1;
    for (long t = 0; t < tokens; t++)
        if (ids[t] < 0 || ids[t] >= rows) return -2;
    int bs = BLOCK_SIZE[fmt];
    long blocks = depth / bs, row_bytes = blocks * BLOCK_BYTES[fmt];
    float values[256]; /* the largest block: a k-quant's */
    for (long t = 0; t < tokens; t++) {
        const uint8_t *row = weight + ids[t] * row_bytes;
        for (long block = 0; block < blocks; block++) {
            if (!bf16_out) {
                dequantize_block(fmt, row + block * BLOCK_BYTES[fmt], (float *)out + t * depth + block * bs);
                continue;
            }
            dequantize_block(fmt, row + block * BLOCK_BYTES[fmt], values);
            uint16_t *dst = (uint16_t *)out + t * depth + block * bs;
            for (int i = 0; i < bs; i++) dst[i] = float_to_bf16(values[i]);
        }
    }
    return 0;
}
