/* quant_linear's token-tile int8 GEMM, for many rows (prefill, batched decode): the
 * output columns go in panels of PANEL_ROWS weight rows, and each thread unpacks one
 * panel at a time, once per call, into unsigned int8 codes laid out for a broadcast dot
 * (ggml's x86 repacked GEMM idea): for every 4 weights of K, the panel's 16 rows' 4
 * codes side by side, 64 bytes, so one vector holds 8 rows' 4 codes and vpdpbusd against
 * one token's 4 activation codes broadcast gives 8 rows' partial dots at once. Every
 * token of the call then runs over the panel (L1-resident: 16 K bytes of codes plus its
 * scales), TILE_TOKENS tokens at a time with their accumulators in registers, so a
 * weight is unpacked once per call however many tokens there are, where the row dot
 * path unpacks it once per 16 tokens and reads the activations once per output row.
 *
 * Numerics: each group of GROUP[fmt] weights (a scale and a min; 32 where the format's
 * 16-groups come in equal pairs) sums its code products exactly in int32, then adds
 * sum * scale * x_scale - min' * x_sum in fp32 (the code offset that makes the format's
 * codes unsigned, CODE_OFFSET, folded into min'). Codes past 127 (Q8_0's, offset by 128)
 * would saturate vpmaddubsw's int16 pair sums, so the AVX2 path takes their top bit
 * apart. The three paths compute the same int32 sums and the same fp32 operations in
 * the same order. */
#ifndef ACCORD_GGUF_TOKEN_TILE_H
#define ACCORD_GGUF_TOKEN_TILE_H
#include <stdlib.h>

#include "gguf_blocks.h"

#define PANEL_ROWS 16
/* Tokens per register tile: 2 x TILE_TOKENS int32 sums and as many fp32 accumulators,
 * which 32 vector registers hold at 4 (AVX512VL) and 16 at 2. */
#if defined(__AVX512VL__)
#define TILE_TOKENS 4
#else
#define TILE_TOKENS 2
#endif

/* What makes each format's codes (gguf_blocks.h's unpack) unsigned, and its group. */
static const int CODE_OFFSET[] = {128, 8, 0, 16, 0, 0, 4, 0, 0, 32};
static const int GROUP[] = {32, 32, 32, 32, 32, 16, 16, 32, 32, 16};

/* One panel unpacked: codes [depth / 4][PANEL_ROWS][4], and per group and row a scale
 * and a min (rows past the weight's last are zero). */
typedef struct {
    uint8_t *codes;
    float *scale;
    float *min;
} panel;

/* The codes of one unpacked block made unsigned (+ offset, modulo 256 as the panel
 * stores them). */
static inline void unsigned_codes(const int8_t *q, int offset, int bs, uint8_t *codes) {
#if defined(__AVX2__)
    for (int k = 0; k < bs; k += 32)
        _mm256_storeu_si256((__m256i *)(codes + k),
                            _mm256_add_epi8(_mm256_loadu_si256((const __m256i *)(q + k)), _mm256_set1_epi8((char)offset)));
#else
    for (int k = 0; k < bs; k++) codes[k] = (uint8_t)(q[k] + offset);
#endif
}

/* One block column of the panel, from its 16 rows' codes (row-major, `bs` each) to the
 * panel's layout at dst: quad j (codes 4j-4j+3) of rows 0-7 side by side in dst's
 * bytes 64j to 64j + 31, of rows 8-15 in the next 32. On AVX2 an 8 x 8 transpose of
 * 32-bit quads per 32 codes of 8 rows, rather than a 4-byte store per quad. */
static inline void place_quads(const uint8_t (*codes)[256], int bs, uint8_t *dst) {
#if defined(__AVX2__)
    for (int c = 0; c < bs / 32; c++)
        for (int half = 0; half < 2; half++) {
            __m256i v[8], a[8], b[8];
            for (int i = 0; i < 8; i++) v[i] = _mm256_loadu_si256((const __m256i *)(codes[8 * half + i] + 32 * c));
            /* Row pairs interleaved by quad, then by quad pair, then the 128-bit halves
             * swapped across rows 0-3 and 4-7: vector j holds quad j of the 8 rows. */
            for (int i = 0; i < 8; i += 2) {
                a[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
                a[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                b[i] = _mm256_unpacklo_epi64(a[i], a[i + 2]);
                b[i + 1] = _mm256_unpackhi_epi64(a[i], a[i + 2]);
                b[i + 2] = _mm256_unpacklo_epi64(a[i + 1], a[i + 3]);
                b[i + 3] = _mm256_unpackhi_epi64(a[i + 1], a[i + 3]);
            }
            uint8_t *out = dst + 8 * c * 64 + 32 * half;
            for (int j = 0; j < 4; j++) {
                _mm256_storeu_si256((__m256i *)(out + 64 * j), _mm256_permute2x128_si256(b[j], b[j + 4], 0x20));
                _mm256_storeu_si256((__m256i *)(out + 64 * (j + 4)), _mm256_permute2x128_si256(b[j], b[j + 4], 0x31));
            }
        }
#else
    for (int r = 0; r < PANEL_ROWS; r++)
        for (int k = 0; k < bs; k += 4) memcpy(dst + k / 4 * 64 + (r / 8) * 32 + (r % 8) * 4, codes[r] + k, 4);
#endif
}

static void unpack_panel(int fmt, const uint8_t *weight, long row_bytes, int rows, long depth, panel *p) {
    int bs = BLOCK_SIZE[fmt], group = GROUP[fmt], offset = CODE_OFFSET[fmt];
    /* One block column's codes, row by row (rows past the weight's last stay zero). */
    uint8_t codes[PANEL_ROWS][256];
    if (rows < PANEL_ROWS) {
        memset(codes[rows], 0, sizeof(codes[0]) * (size_t)(PANEL_ROWS - rows));
        memset(p->scale, 0, sizeof(float) * (size_t)(depth / group) * PANEL_ROWS);
        memset(p->min, 0, sizeof(float) * (size_t)(depth / group) * PANEL_ROWS);
    }
    unpacked u;
    for (long block = 0; block < depth / bs; block++) {
        long first = block * bs;
        for (int r = 0; r < rows; r++) {
            unpack(fmt, weight + r * row_bytes + block * BLOCK_BYTES[fmt], &u);
            unsigned_codes(u.q, offset, bs, codes[r]);
            for (int g = 0; g < bs / group; g++) {
                float scale = u.scale[g * group / 16];
                long at = (first / group + g) * PANEL_ROWS + r;
                p->scale[at] = scale;
                p->min[at] = u.min[g * group / 16] + scale * offset;
            }
        }
        place_quads((const uint8_t (*)[256])codes, bs, p->codes + first / 4 * 64);
    }
}

#if defined(__AVX2__)
/* acc + the 4-byte dots of codes w (unsigned) and activations x (signed) per lane. */
static inline __attribute__((always_inline)) __m256i tile_dot(int path, int wide, __m256i acc, __m256i w, __m256i x) {
#if defined(HAVE_VNNI)
    if (path == PATH_VNNI) return dpbusd(acc, w, x);
#endif
    __m256i ones = _mm256_set1_epi16(1);
    if (!wide) return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones));
    __m256i top = _mm256_set1_epi8((char)0x80);
    __m256i low = _mm256_andnot_si256(top, w), high = _mm256_srli_epi16(_mm256_and_si256(w, top), 7);
    __m256i sums = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(low, x), ones),
                                    _mm256_madd_epi16(_mm256_maddubs_epi16(high, x), _mm256_set1_epi16(128)));
    return _mm256_add_epi32(acc, sums);
}

/* acc [count][PANEL_ROWS] = the panel's rows dotted with `count` tokens (x codes with
 * row stride `depth`, their scales per 32 and scaled sums per 16). */
static inline __attribute__((always_inline)) void tile_simd(
    int path, int group, int wide, int count, const panel *p, long depth, const int8_t *xq, const float *xs,
    const float *xsum, float *acc
) {
    __m256 total[TILE_TOKENS][2];
    for (int t = 0; t < count; t++) total[t][0] = total[t][1] = _mm256_setzero_ps();
    for (long g = 0; g < depth / group; g++) {
        __m256i sums[TILE_TOKENS][2];
        for (int t = 0; t < count; t++) sums[t][0] = sums[t][1] = _mm256_setzero_si256();
        const uint8_t *codes = p->codes + g * group * PANEL_ROWS;
        for (int j = 0; j < group / 4; j++) {
            __m256i w0 = _mm256_loadu_si256((const __m256i *)(codes + 64 * j));
            __m256i w1 = _mm256_loadu_si256((const __m256i *)(codes + 64 * j + 32));
            for (int t = 0; t < count; t++) {
                int32_t quad;
                memcpy(&quad, xq + t * depth + g * group + 4 * j, 4);
                __m256i x = _mm256_set1_epi32(quad);
                sums[t][0] = tile_dot(path, wide, sums[t][0], w0, x);
                sums[t][1] = tile_dot(path, wide, sums[t][1], w1, x);
            }
        }
        const float *scale = p->scale + g * PANEL_ROWS, *min = p->min + g * PANEL_ROWS;
        __m256 s0 = _mm256_loadu_ps(scale), s1 = _mm256_loadu_ps(scale + 8);
        __m256 m0 = _mm256_loadu_ps(min), m1 = _mm256_loadu_ps(min + 8);
        for (int t = 0; t < count; t++) {
            __m256 x_scale = _mm256_set1_ps(xs[t * (depth / 32) + g * group / 32]);
            const float *sum16 = xsum + t * (depth / 16) + g * group / 16;
            __m256 x_sum = _mm256_set1_ps(group == 32 ? sum16[0] + sum16[1] : sum16[0]);
            total[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[t][0]), _mm256_mul_ps(s0, x_scale), total[t][0]);
            total[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[t][1]), _mm256_mul_ps(s1, x_scale), total[t][1]);
            total[t][0] = _mm256_fnmadd_ps(m0, x_sum, total[t][0]);
            total[t][1] = _mm256_fnmadd_ps(m1, x_sum, total[t][1]);
        }
    }
    for (int t = 0; t < count; t++) {
        _mm256_storeu_ps(acc + t * PANEL_ROWS, total[t][0]);
        _mm256_storeu_ps(acc + t * PANEL_ROWS + 8, total[t][1]);
    }
}
#endif

/* The plain C form of tile_simd, one token at a time, in the same operation order. */
static void tile_plain(int group, const panel *p, long depth, const int8_t *xq, const float *xs, const float *xsum, float *acc) {
    for (int r = 0; r < PANEL_ROWS; r++) {
        const uint8_t *lane = p->codes + (r / 8) * 32 + (r % 8) * 4;
        float total = 0.0f;
        for (long g = 0; g < depth / group; g++) {
            int32_t sum = 0;
            for (int k = 0; k < group; k++) {
                long at = g * group + k;
                sum += lane[at / 4 * 64 + at % 4] * xq[at];
            }
            float x_scale = xs[g * group / 32];
            const float *sum16 = xsum + g * group / 16;
            float x_sum = group == 32 ? sum16[0] + sum16[1] : sum16[0];
            long at = g * PANEL_ROWS + r;
            total = fmaf((float)sum, p->scale[at] * x_scale, total);
            total = fmaf(-p->min[at], x_sum, total);
        }
        acc[r] = total;
    }
}

/* One call of tile_simd with its format's constants and a token count the compiler sees
 * (a full tile or one token), so the inner loops unroll into registers. */
static void tile_tokens(int path, int fmt, int count, const panel *p, long depth, const int8_t *xq, const float *xs,
                        const float *xsum, float *acc) {
    if (path == PATH_PLAIN) {
        for (int t = 0; t < count; t++)
            tile_plain(GROUP[fmt], p, depth, xq + t * depth, xs + t * (depth / 32), xsum + t * (depth / 16),
                       acc + t * PANEL_ROWS);
        return;
    }
#if defined(__AVX2__)
#define TILE_CASE(PATH, GROUP_, WIDE)                                                          \
    if (count == TILE_TOKENS)                                                                  \
        tile_simd(PATH, GROUP_, WIDE, TILE_TOKENS, p, depth, xq, xs, xsum, acc);               \
    else                                                                                       \
        for (int t = 0; t < count; t++)                                                        \
            tile_simd(PATH, GROUP_, WIDE, 1, p, depth, xq + t * depth, xs + t * (depth / 32),  \
                      xsum + t * (depth / 16), acc + t * PANEL_ROWS);
#define TILE_FORMATS(PATH)                                  \
    if (fmt == Q8_0) {                                      \
        TILE_CASE(PATH, 32, 1)                              \
    } else if (GROUP[fmt] == 32) {                          \
        TILE_CASE(PATH, 32, 0)                              \
    } else {                                                \
        TILE_CASE(PATH, 16, 0)                              \
    }
#if defined(HAVE_VNNI)
    if (path == PATH_VNNI) {
        TILE_FORMATS(PATH_VNNI)
        return;
    }
#endif
    TILE_FORMATS(PATH_AVX2)
#undef TILE_FORMATS
#undef TILE_CASE
#endif
}

/* out [tokens, rows] fp32 = the quantised activations (xq, xs, xsum of every token) @
 * W^T (+ bias), W the packed rows of `fmt`; OpenMP over the panels. Returns 0, or -1
 * where a thread's panel cannot be allocated. */
static int token_tile_gemm(const uint8_t *weight, const float *bias, float *out, long tokens, long rows, long depth,
                           int fmt, int path, const int8_t *xq, const float *xs, const float *xsum, int threads) {
    long panels = (rows + PANEL_ROWS - 1) / PANEL_ROWS, row_bytes = depth / BLOCK_SIZE[fmt] * BLOCK_BYTES[fmt];
    size_t code_bytes = (size_t)depth * PANEL_ROWS, scale_bytes = sizeof(float) * (size_t)(depth / GROUP[fmt]) * PANEL_ROWS;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        panel p;
        uint8_t *memory = aligned_alloc(64, (code_bytes + 2 * scale_bytes + 63) / 64 * 64);
        failed = memory == NULL;
        p.codes = memory;
        p.scale = (float *)(memory + code_bytes);
        p.min = (float *)(memory + code_bytes + scale_bytes);
#pragma omp for schedule(dynamic, 1)
        for (long n = 0; n < panels; n++) {
            if (memory == NULL) continue;
            long first = n * PANEL_ROWS;
            int count = rows - first < PANEL_ROWS ? (int)(rows - first) : PANEL_ROWS;
            unpack_panel(fmt, weight + first * row_bytes, row_bytes, count, depth, &p);
            for (long t0 = 0; t0 < tokens; t0 += TILE_TOKENS) {
                int tile = tokens - t0 < TILE_TOKENS ? (int)(tokens - t0) : TILE_TOKENS;
                float acc[TILE_TOKENS * PANEL_ROWS];
                tile_tokens(path, fmt, tile, &p, depth, xq + t0 * depth, xs + t0 * (depth / 32),
                            xsum + t0 * (depth / 16), acc);
                for (int t = 0; t < tile; t++)
                    for (int r = 0; r < count; r++)
                        out[(t0 + t) * rows + first + r] = acc[t * PANEL_ROWS + r] + (bias ? bias[first + r] : 0.0f);
            }
        }
        free(memory);
    }
    return failed ? -1 : 0;
}
#endif
