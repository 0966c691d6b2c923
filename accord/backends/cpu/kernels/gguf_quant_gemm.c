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
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

enum { Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K };
enum { PATH_PLAIN = 0, PATH_AVX2 = 1, PATH_VNNI = 2 };
/* Most tokens one call's dot path takes (the caller splits larger calls). */
#define MAX_TOKENS 16

typedef struct {
    int8_t q[256];
    float scale[16];
    float min[16];
} unpacked;

static const int BLOCK_SIZE[] = {32, 32, 32, 32, 32, 256, 256, 256, 256, 256};
static const int BLOCK_BYTES[] = {34, 18, 20, 22, 24, 84, 110, 144, 176, 210};

/* IEEE half to float, subnormals included (F16C where the build has it). */
static inline float half(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
#if defined(__F16C__)
    return _cvtsh_ss(h);
#endif
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
    if (exp == 0) {
        float v = ldexpf((float)mant, -24);
        return sign ? -v : v;
    }
    bits = exp == 31 ? sign | 0x7F800000u | (mant << 13) : sign | ((exp + 112) << 23) | (mant << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline void fill(float *dst, float value, int n) {
    for (int i = 0; i < n; i++) dst[i] = value;
}

/* Q4_K/Q5_K's six-bit scale and min j (ggml's get_scale_min_k4). */
static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* One block of format `fmt` into codes, scales and mins (16 weights each). */
static void unpack(int fmt, const uint8_t *b, unpacked *u) {
    switch (fmt) {
    case Q8_0:
        memcpy(u->q, b + 2, 32);
        fill(u->scale, half(b), 2);
        fill(u->min, 0.0f, 2);
        break;
    case Q4_0:
    case Q4_1: {
        const uint8_t *qs = b + (fmt == Q4_0 ? 2 : 4);
        int offset = fmt == Q4_0 ? 8 : 0;
        for (int j = 0; j < 16; j++) {
            u->q[j] = (int8_t)((qs[j] & 0xF) - offset);
            u->q[j + 16] = (int8_t)((qs[j] >> 4) - offset);
        }
        fill(u->scale, half(b), 2);
        fill(u->min, fmt == Q4_0 ? 0.0f : -half(b + 2), 2);
        break;
    }
    case Q5_0:
    case Q5_1: {
        int at = fmt == Q5_0 ? 2 : 4, offset = fmt == Q5_0 ? 16 : 0;
        uint32_t qh = (uint32_t)b[at] | (uint32_t)b[at + 1] << 8 | (uint32_t)b[at + 2] << 16 | (uint32_t)b[at + 3] << 24;
        const uint8_t *qs = b + at + 4;
        for (int j = 0; j < 16; j++) {
            u->q[j] = (int8_t)(((qs[j] & 0xF) | ((qh >> j) & 1) << 4) - offset);
            u->q[j + 16] = (int8_t)(((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - offset);
        }
        fill(u->scale, half(b), 2);
        fill(u->min, fmt == Q5_0 ? 0.0f : -half(b + 2), 2);
        break;
    }
    case Q2_K: {
        const uint8_t *scales = b, *qs = b + 16;
        float d = half(b + 80), dmin = half(b + 82);
        for (int w = 0; w < 256; w++) {
            int r = w % 128;
            u->q[w] = (int8_t)((qs[(w / 128) * 32 + r % 32] >> (2 * (r / 32))) & 3);
        }
        for (int g = 0; g < 16; g++) {
            u->scale[g] = d * (scales[g] & 0xF);
            u->min[g] = dmin * (scales[g] >> 4);
        }
        break;
    }
    case Q3_K: {
        const uint8_t *hmask = b, *qs = b + 32, *s = b + 96;
        float d = half(b + 108);
        for (int w = 0; w < 256; w++) {
            int r = w % 128, high = (hmask[w % 32] >> (w / 32)) & 1;
            u->q[w] = (int8_t)(((qs[(w / 128) * 32 + r % 32] >> (2 * (r / 32))) & 3) - (high ? 0 : 4));
        }
        for (int g = 0; g < 16; g++) {
            int low = g < 8 ? s[g] & 0xF : s[g - 8] >> 4, hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
            u->scale[g] = d * ((low | hi << 4) - 32);
            u->min[g] = 0.0f;
        }
        break;
    }
    case Q4_K:
    case Q5_K: {
        float d = half(b), dmin = half(b + 2);
        const uint8_t *qh = b + 16, *qs = b + (fmt == Q4_K ? 16 : 48);
#if defined(__AVX2__)
        /* Chunk c of 64 weights: 32 bytes' low nibbles, then their high ones; Q5_K's
         * fifth bits are bits 2c and 2c + 1 of qh's 32 bytes. */
        __m256i low = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
        __m256i high = _mm256_loadu_si256((const __m256i *)qh);
        for (int c = 0; c < 4; c++) {
            __m256i bytes = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i first = _mm256_and_si256(bytes, low), second = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
            if (fmt == Q5_K) {
                first = _mm256_or_si256(first, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(high, 2 * c), one), 4));
                second = _mm256_or_si256(
                    second, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(high, 2 * c + 1), one), 4));
            }
            _mm256_storeu_si256((__m256i *)(u->q + 64 * c), first);
            _mm256_storeu_si256((__m256i *)(u->q + 64 * c + 32), second);
        }
#else
        for (int w = 0; w < 256; w++) {
            int r = w % 64, byte = qs[(w / 64) * 32 + r % 32];
            int code = r < 32 ? byte & 0xF : byte >> 4;
            if (fmt == Q5_K) code |= ((qh[w % 32] >> (w / 32)) & 1) << 4;
            u->q[w] = (int8_t)code;
        }
#endif
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            scale_min_k4(j, b + 4, &sc, &mn);
            fill(u->scale + 2 * j, d * sc, 2);
            fill(u->min + 2 * j, dmin * mn, 2);
        }
        break;
    }
    case Q6_K: {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *scales = (const int8_t *)(b + 192);
        float d = half(b + 208);
#if defined(__AVX2__)
        /* Half h, part k of 32 weights: ql's bytes 32k.. (k < 2) low nibbles, or bytes
         * 32(k-2).. high nibbles; bits 2k of qh's 32 bytes on top. */
        __m256i nibble = _mm256_set1_epi8(0xF), two = _mm256_set1_epi8(3), offset = _mm256_set1_epi8(32);
        for (int h = 0; h < 2; h++) {
            __m256i high = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
            for (int k = 0; k < 4; k++) {
                __m256i bytes = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32 * (k % 2)));
                __m256i low = _mm256_and_si256(k < 2 ? bytes : _mm256_srli_epi16(bytes, 4), nibble);
                __m256i top = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(high, 2 * k), two), 4);
                _mm256_storeu_si256((__m256i *)(u->q + 128 * h + 32 * k), _mm256_sub_epi8(_mm256_or_si256(low, top), offset));
            }
        }
#else
        for (int w = 0; w < 256; w++) {
            int h = w / 128, r = w % 128;
            int byte = ql[h * 64 + r % 64], low = r < 64 ? byte & 0xF : byte >> 4;
            int high = (qh[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
            u->q[w] = (int8_t)((low | high << 4) - 32);
        }
#endif
        for (int g = 0; g < 16; g++) {
            u->scale[g] = d * scales[g];
            u->min[g] = 0.0f;
        }
        break;
    }
    }
}

/* x [tokens, depth] fp32 -> codes, one scale per 32 and the scaled code sum per 16
 * (scale * sum of the 16 codes), ggml's Q8 activations. */
static void quantize_activations(const float *x, long depth, int8_t *q, float *scale, float *sum16) {
    for (long block = 0; block < depth / 32; block++) {
        const float *v = x + block * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[i]));
        float d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
        int sums[2] = {0, 0};
        for (int i = 0; i < 32; i++) {
            int code = (int)nearbyintf(v[i] * inv);
            q[block * 32 + i] = (int8_t)code;
            sums[i / 16] += code;
        }
        scale[block] = d;
        sum16[2 * block] = d * sums[0];
        sum16[2 * block + 1] = d * sums[1];
    }
}

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
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
static inline __m256i lanes_vnni(__m256i w, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
#else
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
#endif
}
#define HAVE_VNNI 1
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
 * rows of `fmt`; scratch holds tokens * (depth + depth / 32 * 4 + depth / 16 * 4) bytes.
 * Returns 0, or -1 for an unknown format, path or token count. */
int accord_gguf_linear(
    const float *x, const uint8_t *weight, const float *bias, float *out, long tokens, long rows, long depth, int fmt,
    int path, void *scratch, int threads
) {
    if (fmt < Q8_0 || fmt > Q6_K || !(accord_gguf_paths() >> path & 1) || tokens < 1 || tokens > MAX_TOKENS)
        return -1;
    int8_t *xq = (int8_t *)scratch;
    float *xs = (float *)(xq + tokens * depth), *xsum = xs + tokens * (depth / 32);
    for (long t = 0; t < tokens; t++)
        quantize_activations(x + t * depth, depth, xq + t * depth, xs + t * (depth / 32), xsum + t * (depth / 16));
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
