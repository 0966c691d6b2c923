/* The group-quantised linear (group_quant_linear) on its packed int32 codes. The row dot
 * (decode) streams each output row's codes once per call and never writes a dequantised
 * weight: per group, sum_k x_k * code_k is accumulated in fp32 straight from the codes
 * (4-bit rows against x split into even and odd channels, so each byte's two nibbles
 * meet contiguous activations), and the group contributes scale * (that - zero * sum_k
 * x_k), the activation sums computed once per call. Act-order rows (g_idx), whose
 * groups are scattered, are dequantised into an fp32 row first and dotted with each
 * token. accord_group_quant_dequantize writes rows as fp32 ((code - zero) * scale,
 * exact), for the many-rows path that hands them to a GEMM. Code k of a row is bit
 * k*bits of its little-endian words (4-bit: byte k/2's low nibble for even k); OpenMP
 * splits the output rows.
 */
#include <stdint.h>
#include <stdlib.h>

/* Lanes of the dot's partial sums: independent accumulators the compiler vectorises
 * without reassociating one running sum. */
#define LANES 16

/* Row weights [depth] in fp32 from the row's words, scales and zeros (per group). */
static void dequantize_row(const int32_t *words, const float *scales, const uint8_t *zeros, const int32_t *g_idx,
                           long depth, int bits, long group, long groups, float *out) {
    const uint8_t *bytes = (const uint8_t *)words;
    const float symmetric_zero = (float)(1 << (bits - 1));
    if (g_idx) {
        for (long k = 0; k < depth; k++) {
            int code = bits == 8 ? bytes[k] : (bytes[k >> 1] >> ((k & 1) * 4)) & 15;
            long g = g_idx[k];
            out[k] = ((float)code - (zeros ? (float)zeros[g] : symmetric_zero)) * scales[g];
        }
        return;
    }
    long width = group > 0 ? group : depth;
    for (long g = 0; g < groups; g++) {
        long start = g * width, stop = start + width < depth ? start + width : depth;
        const float scale = scales[g], zero = zeros ? (float)zeros[g] : symmetric_zero;
        long k = start;
        if (bits == 8) {
            for (; k < stop; k++) out[k] = ((float)bytes[k] - zero) * scale;
            continue;
        }
        if (k & 1) { out[k] = ((float)(bytes[k >> 1] >> 4) - zero) * scale; k++; }
        for (; k + 1 < stop; k += 2) {
            uint8_t pair = bytes[k >> 1];
            out[k] = ((float)(pair & 15) - zero) * scale;
            out[k + 1] = ((float)(pair >> 4) - zero) * scale;
        }
        if (k < stop) out[k] = ((float)(bytes[k >> 1] & 15) - zero) * scale;
    }
}

static float dot(const float *x, const float *w, long depth) {
    float lanes[LANES] = {0};
    long k = 0;
    for (; k + LANES <= depth; k += LANES)
        for (int i = 0; i < LANES; i++) lanes[i] += x[k + i] * w[k + i];
    float sum = 0;
    for (; k < depth; k++) sum += x[k] * w[k];
    for (int i = 0; i < LANES; i++) sum += lanes[i];
    return sum;
}

/* sum_k x_k * code_k over channels [start, stop) of a 4-bit row (start even), x given
 * as its even channels `even` and odd ones `odd`. */
static float codes_dot4(const uint8_t *bytes, const float *even, const float *odd, long start, long stop) {
    float low[LANES] = {0}, high[LANES] = {0};
    long j = start / 2, pairs = stop / 2;
    for (; j + LANES <= pairs; j += LANES)
        for (int i = 0; i < LANES; i++) {
            low[i] += even[j + i] * (float)(bytes[j + i] & 15);
            high[i] += odd[j + i] * (float)(bytes[j + i] >> 4);
        }
    float sum = 0;
    for (; j < pairs; j++) sum += even[j] * (float)(bytes[j] & 15) + odd[j] * (float)(bytes[j] >> 4);
    if (stop & 1) sum += even[stop / 2] * (float)(bytes[stop / 2] & 15);
    for (int i = 0; i < LANES; i++) sum += low[i] + high[i];
    return sum;
}

/* sum_k x_k * code_k over channels [start, stop) of an 8-bit row. */
static float codes_dot8(const uint8_t *bytes, const float *x, long start, long stop) {
    float lanes[LANES] = {0};
    long k = start;
    for (; k + LANES <= stop; k += LANES)
        for (int i = 0; i < LANES; i++) lanes[i] += x[k + i] * (float)bytes[k + i];
    float sum = 0;
    for (; k < stop; k++) sum += x[k] * (float)bytes[k];
    for (int i = 0; i < LANES; i++) sum += lanes[i];
    return sum;
}

/* Per token: x's even and odd channels (4-bit rows), and its sum over each group. */
typedef struct {
    float *even, *odd, *sums;
    long half;
} token_views;

static int prepare_tokens(const float *x, long tokens, long depth, long width, long groups, token_views *v) {
    v->half = (depth + 1) / 2;
    v->even = calloc(tokens * v->half, sizeof(float));
    v->odd = calloc(tokens * v->half, sizeof(float));
    v->sums = calloc(tokens * groups, sizeof(float));
    if (!v->even || !v->odd || !v->sums) return -1;
    for (long t = 0; t < tokens; t++) {
        const float *row = x + t * depth;
        for (long k = 0; k < depth; k++) {
            (k & 1 ? v->odd : v->even)[t * v->half + k / 2] = row[k];
            v->sums[t * groups + k / width] += row[k];
        }
    }
    return 0;
}

/* out [tokens, rows] fp32 = x [tokens, depth] fp32 @ W^T (+ bias); scales fp32 [rows,
 * groups], zeros uint8 [rows, groups] or NULL (symmetric), g_idx int32 [depth] or NULL.
 * Returns -1 where a buffer cannot be allocated. */
int accord_group_quant_linear(const float *x, const int32_t *words, const float *scales, const uint8_t *zeros,
                              const int32_t *g_idx, const float *bias, float *out, long tokens, long rows,
                              long depth, int bits, long group, long groups, int threads) {
    long row_words = (depth * bits + 31) / 32, width = group > 0 ? group : depth;
    /* Rows whose groups start on even channels run on the codes; the rest dequantise. */
    int on_codes = !g_idx && (bits == 8 || width % 2 == 0);
    token_views v = {0};
    if (on_codes && prepare_tokens(x, tokens, depth, width, groups, &v)) {
        free(v.even), free(v.odd), free(v.sums);
        return -1;
    }
    const float symmetric_zero = (float)(1 << (bits - 1));
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        float *w = on_codes ? NULL : malloc(depth * sizeof(float));
        if (!on_codes && !w) failed = 1;
#pragma omp for schedule(static)
        for (long n = 0; n < rows; n++) {
            const uint8_t *bytes = (const uint8_t *)(words + n * row_words);
            const float *scale = scales + n * groups;
            const uint8_t *zero = zeros ? zeros + n * groups : NULL;
            if (!on_codes) {
                if (!w) continue;
                dequantize_row(words + n * row_words, scale, zero, g_idx, depth, bits, group, groups, w);
                for (long t = 0; t < tokens; t++)
                    out[t * rows + n] = dot(x + t * depth, w, depth) + (bias ? bias[n] : 0.0f);
                continue;
            }
            for (long t = 0; t < tokens; t++) {
                float sum = 0;
                for (long g = 0; g < groups; g++) {
                    long start = g * width, stop = start + width < depth ? start + width : depth;
                    float codes = bits == 8 ? codes_dot8(bytes, x + t * depth, start, stop)
                                            : codes_dot4(bytes, v.even + t * v.half, v.odd + t * v.half, start, stop);
                    float z = zero ? (float)zero[g] : symmetric_zero;
                    sum += scale[g] * (codes - z * v.sums[t * groups + g]);
                }
                out[t * rows + n] = sum + (bias ? bias[n] : 0.0f);
            }
        }
        free(w);
    }
    free(v.even), free(v.odd), free(v.sums);
    return failed ? -1 : 0;
}

/* Rows [first, first + count) of the weight as fp32 [count, depth]. */
int accord_group_quant_dequantize(const int32_t *words, const float *scales, const uint8_t *zeros,
                                  const int32_t *g_idx, float *out, long first, long count, long depth, int bits,
                                  long group, long groups, int threads) {
    long row_words = (depth * bits + 31) / 32;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long n = first; n < first + count; n++)
        dequantize_row(words + n * row_words, scales + n * groups, zeros ? zeros + n * groups : NULL, g_idx, depth,
                       bits, group, groups, out + (n - first) * depth);
    return 0;
}
