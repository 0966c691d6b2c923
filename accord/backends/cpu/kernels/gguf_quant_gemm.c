/* The quantised linear on GGUF blocks as stored (quant_linear): weights stay packed, and
 * each block is unpacked once per call into int8 codes with a float scale and min per 16
 * weights (value = scale * code - min), which every format reduces to. Activations are
 * quantised to int8 per 32-wide block, as ggml's Q8 dot products do them, with each
 * 16-group's code sum kept for the mins. Dot products of 32 codes run on AVX-VNNI /
 * AVX512-VNNI (vpdpbusd), on AVX2 (vpmaddubsw + vpmaddwd), or in plain C: `path` picks
 * one of those compiled for this host (accord_gguf_paths says which), so tests force
 * each. OpenMP splits the output rows. accord_gguf_dequantize writes rows as fp32, for
 * the many-rows path that hands them to a GEMM.
 */
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
/* The 8 int32 lanes of a 32-code dot: lanes 0-3 hold the first 16 codes' partial sums,
 * lanes 4-7 the second's. vpdpbusd and vpmaddubsw take unsigned x signed bytes, so the
 * weight's sign moves onto the activation (|w| * sign(w) x). */
static inline __m256i lanes_avx2(__m256i w, __m256i x) {
    __m256i products = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(products, _mm256_set1_epi16(1));
}
#endif
#if defined(HAVE_VNNI)
static inline __m256i lanes_vnni(__m256i w, __m256i x) {
    return dpbusd(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}
#endif

#if defined(__AVX2__)
/* The 32 codes of a Q8_0, Q4_0 or Q4_1 block straight into a vector (one scale for the
 * block, no unpacking through memory): 1, or 0 for the other formats. */
static inline int vector_codes(int fmt, const uint8_t *b, __m256i *codes) {
    if (fmt == Q8_0) {
        *codes = _mm256_loadu_si256((const __m256i *)(b + 2));
        return 1;
    }
    if (fmt != Q4_0 && fmt != Q4_1) return 0;
    __m128i packed = _mm_loadu_si128((const __m128i *)(b + (fmt == Q4_0 ? 2 : 4))), low = _mm_set1_epi8(0xF);
    __m256i nibbles = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low), _mm_and_si128(packed, low));
    *codes = fmt == Q4_0 ? _mm256_sub_epi8(nibbles, _mm256_set1_epi8(8)) : nibbles;
    return 1;
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

/* One output row for every token: block by block, unpacked once, dotted with each
 * token's codes. */
static void row_dot(
    int fmt, int path, const uint8_t *row, long blocks, long depth, int tokens, const int8_t *xq, const float *xs,
    const float *xsum, float *acc
) {
    int bs = BLOCK_SIZE[fmt];
    unpacked u;
#if defined(__AVX2__)
    __m256 vacc[MAX_TOKENS];
    for (int t = 0; t < tokens; t++) vacc[t] = _mm256_setzero_ps();
#endif
    for (int t = 0; t < tokens; t++) acc[t] = 0.0f;
    for (long block = 0; block < blocks; block++) {
        const uint8_t *b = row + block * BLOCK_BYTES[fmt];
        long first = block * bs;
#if defined(__AVX2__)
        __m256i w;
        if (path != PATH_PLAIN && vector_codes(fmt, b, &w)) {
            /* One scale (and Q4_1's one min) for all 32 weights. */
            float d = half(b), m = fmt == Q4_1 ? half(b + 2) : 0.0f;
            for (int t = 0; t < tokens; t++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(xq + t * depth + first));
#if defined(HAVE_VNNI)
                __m256i lanes = path == PATH_VNNI ? lanes_vnni(w, v) : lanes_avx2(w, v);
#else
                __m256i lanes = lanes_avx2(w, v);
#endif
                const float *sum16 = xsum + t * (depth / 16) + first / 16;
                acc[t] += m * (sum16[0] + sum16[1]);
                vacc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(d * xs[t * (depth / 32) + block]), vacc[t]);
            }
            continue;
        }
#endif
        unpack(fmt, b, &u);
        for (int t = 0; t < tokens; t++) {
            const int8_t *x = xq + t * depth + first;
            const float *scale = xs + t * (depth / 32) + first / 32, *sum16 = xsum + t * (depth / 16) + first / 16;
            float minus = 0.0f;
            for (int g = 0; g < bs / 16; g++) minus += u.min[g] * sum16[g];
            acc[t] -= minus;
            for (int c = 0; c < bs / 32; c++) {
                float s0 = u.scale[2 * c] * scale[c], s1 = u.scale[2 * c + 1] * scale[c];
                if (path == PATH_PLAIN) {
                    acc[t] += dot32_plain(u.q + 32 * c, x + 32 * c, s0, s1);
                    continue;
                }
#if defined(__AVX2__)
                __m256i w = _mm256_loadu_si256((const __m256i *)(u.q + 32 * c));
                __m256i v = _mm256_loadu_si256((const __m256i *)(x + 32 * c));
#if defined(HAVE_VNNI)
                __m256i lanes = path == PATH_VNNI ? lanes_vnni(w, v) : lanes_avx2(w, v);
#else
                __m256i lanes = lanes_avx2(w, v);
#endif
                __m256 scales = _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0));
                vacc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), scales, vacc[t]);
#endif
            }
        }
    }
#if defined(__AVX2__)
    if (path != PATH_PLAIN)
        for (int t = 0; t < tokens; t++) acc[t] += hsum(vacc[t]);
#endif
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
#pragma omp parallel for num_threads(threads) schedule(dynamic, 16)
    for (long n = 0; n < rows; n++) {
        float acc[MAX_TOKENS];
        row_dot(fmt, path, weight + n * row_bytes, blocks, depth, (int)tokens, xq, xs, xsum, acc);
        for (long t = 0; t < tokens; t++) out[t * rows + n] = acc[t] + (bias ? bias[n] : 0.0f);
    }
    return 0;
}

/* Rows [first, first + count) of the packed weight as fp32 [count, depth]. */
int accord_gguf_dequantize(const uint8_t *weight, float *out, long first, long count, long depth, int fmt, int threads) {
    if (fmt < Q8_0 || fmt > Q6_K) return -1;
    int bs = BLOCK_SIZE[fmt];
    long blocks = depth / bs, row_bytes = blocks * BLOCK_BYTES[fmt];
#pragma omp parallel for num_threads(threads) schedule(dynamic, 16)
    for (long n = 0; n < count; n++) {
        unpacked u;
        for (long block = 0; block < blocks; block++) {
            unpack(fmt, weight + (first + n) * row_bytes + block * BLOCK_BYTES[fmt], &u);
            float *dst = out + n * depth + block * bs;
            /* Group by group, so the compiler vectorises the 16 conversions of each. */
            for (int g = 0; g < bs / 16; g++) {
                float scale = u.scale[g], min = u.min[g];
                for (int i = 0; i < 16; i++) dst[16 * g + i] = scale * u.q[16 * g + i] - min;
            }
        }
    }
    return 0;
}
