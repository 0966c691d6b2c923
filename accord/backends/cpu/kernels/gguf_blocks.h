/* GGUF blocks decoded for the quant_linear kernels (gguf_quant_gemm.c and its
 * token-tile GEMM): every format unpacks a block into int8 codes with a float scale and
 * min per 16 weights (value = scale * code - min), and activations are quantised to int8
 * per 32, as ggml's Q8 dot products take them. */
#ifndef ACCORD_GGUF_BLOCKS_H
#define ACCORD_GGUF_BLOCKS_H
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

enum { Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K };
/* The dot paths a call can name (accord_gguf_paths says which this build has). */
enum { PATH_PLAIN = 0, PATH_AVX2 = 1, PATH_VNNI = 2 };

#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
#define HAVE_VNNI 1
/* acc + the 4-byte dots of unsigned a and signed b, per int32 lane (vpdpbusd), on
 * AVX512-VNNI or AVX-VNNI. */
static inline __m256i dpbusd(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, a, b);
#else
    return _mm256_dpbusd_avx_epi32(acc, a, b);
#endif
}
#endif

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

#if defined(__AVX2__)
/* A 32-weight block's 16 bytes of nibbles as its 32 codes: the low nibbles are weights
 * 0-15, the high ones 16-31 (Q4_0/Q4_1/Q5_0/Q5_1). */
static inline __m256i nibbles(const uint8_t *qs) {
    __m128i packed = _mm_loadu_si128((const __m128i *)qs), low = _mm_set1_epi8(0xF);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low), _mm_and_si128(packed, low));
}

/* Bit i of `bits` as byte i: 0xFF where set, 0 where clear (Q5_0/Q5_1's fifth bits). */
static inline __m256i bit_bytes(uint32_t bits) {
    /* Byte i gets byte i / 8 of the word, then keeps bit i % 8 of it. */
    __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                         _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    __m256i select = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
}

/* Part p (0-7) of a Q2_K/Q3_K block's 2-bit codes, weights 32p to 32p + 31: bits
 * 2 (p % 4) of the 32 bytes qs[32 (p / 4)..]. */
static inline __m256i crumbs(const uint8_t *qs, int part) {
    __m256i bytes = _mm256_loadu_si256((const __m256i *)(qs + 32 * (part / 4)));
    return _mm256_and_si256(_mm256_srl_epi16(bytes, _mm_cvtsi32_si128(2 * (part % 4))), _mm256_set1_epi8(3));
}
#endif

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
#if defined(__AVX2__)
        _mm256_storeu_si256((__m256i *)u->q, _mm256_sub_epi8(nibbles(qs), _mm256_set1_epi8((char)offset)));
#else
        for (int j = 0; j < 16; j++) {
            u->q[j] = (int8_t)((qs[j] & 0xF) - offset);
            u->q[j + 16] = (int8_t)((qs[j] >> 4) - offset);
        }
#endif
        fill(u->scale, half(b), 2);
        fill(u->min, fmt == Q4_0 ? 0.0f : -half(b + 2), 2);
        break;
    }
    case Q5_0:
    case Q5_1: {
        int at = fmt == Q5_0 ? 2 : 4, offset = fmt == Q5_0 ? 16 : 0;
        uint32_t qh = (uint32_t)b[at] | (uint32_t)b[at + 1] << 8 | (uint32_t)b[at + 2] << 16 | (uint32_t)b[at + 3] << 24;
        const uint8_t *qs = b + at + 4;
#if defined(__AVX2__)
        __m256i fifth = _mm256_and_si256(bit_bytes(qh), _mm256_set1_epi8(16));
        _mm256_storeu_si256((__m256i *)u->q,
                            _mm256_sub_epi8(_mm256_or_si256(nibbles(qs), fifth), _mm256_set1_epi8((char)offset)));
#else
        for (int j = 0; j < 16; j++) {
            u->q[j] = (int8_t)(((qs[j] & 0xF) | ((qh >> j) & 1) << 4) - offset);
            u->q[j + 16] = (int8_t)(((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - offset);
        }
#endif
        fill(u->scale, half(b), 2);
        fill(u->min, fmt == Q5_0 ? 0.0f : -half(b + 2), 2);
        break;
    }
    case Q2_K: {
        const uint8_t *scales = b, *qs = b + 16;
        float d = half(b + 80), dmin = half(b + 82);
#if defined(__AVX2__)
        for (int part = 0; part < 8; part++)
            _mm256_storeu_si256((__m256i *)(u->q + 32 * part), crumbs(qs, part));
#else
        for (int w = 0; w < 256; w++) {
            int r = w % 128;
            u->q[w] = (int8_t)((qs[(w / 128) * 32 + r % 32] >> (2 * (r / 32))) & 3);
        }
#endif
        for (int g = 0; g < 16; g++) {
            u->scale[g] = d * (scales[g] & 0xF);
            u->min[g] = dmin * (scales[g] >> 4);
        }
        break;
    }
    case Q3_K: {
        const uint8_t *hmask = b, *qs = b + 32, *s = b + 96;
        float d = half(b + 108);
#if defined(__AVX2__)
        /* Part p's third bits are bit p of hmask's 32 bytes: a clear bit subtracts 4. */
        __m256i mask = _mm256_loadu_si256((const __m256i *)hmask), one = _mm256_set1_epi8(1);
        for (int part = 0; part < 8; part++) {
            __m256i high = _mm256_and_si256(_mm256_srl_epi16(mask, _mm_cvtsi32_si128(part)), one);
            __m256i codes = _mm256_sub_epi8(_mm256_add_epi8(crumbs(qs, part), _mm256_slli_epi16(high, 2)),
                                            _mm256_set1_epi8(4));
            _mm256_storeu_si256((__m256i *)(u->q + 32 * part), codes);
        }
#else
        for (int w = 0; w < 256; w++) {
            int r = w % 128, high = (hmask[w % 32] >> (w / 32)) & 1;
            u->q[w] = (int8_t)(((qs[(w / 128) * 32 + r % 32] >> (2 * (r / 32))) & 3) - (high ? 0 : 4));
        }
#endif
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

#endif
