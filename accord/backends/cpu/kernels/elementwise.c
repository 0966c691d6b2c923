/* The cpu glue kernels of a decode step in plain C: RMS norm (plain and with the fused
 * residual add), rotary embedding, SiLU-and-mul and the KV cache write.
 *
 * At decode sizes each of these is a few microseconds of arithmetic, while the chain of
 * small aten ops it replaces costs tens of microseconds of dispatch: one ctypes call
 * each is the point. Tensors are contiguous (the contracts say so) fp32 or bf16
 * (dtype code 0 or 1); bf16 is widened on load, computed in fp32 and rounded to nearest
 * even on store, so both dtypes share one fp32 code path. Every row is computed by the
 * same code whatever the row count, so a token's result does not depend on its batch
 * (batch invariance); OpenMP splits rows only where the caller passes threads > 1.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>
#include "bf16.h"

enum { DTYPE_F32 = 0, DTYPE_BF16 = 1 };

/* `call` on rows [first_, last_): one contiguous range per thread of an OpenMP team
 * only where the caller passes threads > 1; otherwise once on every row, since even a
 * team of one costs a libgomp parallel region (several microseconds, more than a decode
 * step's rows). `call` is a call of a ROW_RANGE function, which holds the row loop: the
 * loop is compiled once, not once per branch (the library built in about half the time). */
#define FOR_ROW_RANGES(rows, threads, call)                                          \
    do {                                                                             \
        if ((threads) > 1) {                                                         \
            _Pragma("omp parallel num_threads(threads)")                             \
            {                                                                        \
                long team_ = omp_get_num_threads(), member_ = omp_get_thread_num();  \
                long first_ = (rows) * member_ / team_, last_ = (rows) * (member_ + 1) / team_; \
                call;                                                                \
            }                                                                        \
        } else {                                                                     \
            long first_ = 0, last_ = (rows);                                         \
            call;                                                                    \
        }                                                                            \
    } while (0)
#define ROW_RANGE static __attribute__((noinline)) void

/* The loops that carry the arithmetic, vectorised whatever the optimisation level: the
 * library is built at -O2 (`_native_elementwise.LIBRARY`), whose very cheap cost model
 * left them scalar (SiLU-and-mul 4x slower); -O3 vectorised them too, but with every
 * other loop of the file, and its build took ~1.5x the CPU time (3.2 vs 2.2 s, part of
 * a cold start-up). Each iteration touches only its own elements (in place too). */
#define SIMD_LOOP _Pragma("omp simd")

/* Row functions are inlined into each entry point's per-dtype branch, so `dtype` is a
 * constant in every loop and the loops vectorise (a dtype test inside one stops that). */
#define ROW_FUNCTION static inline __attribute__((always_inline))
#define FOR_DTYPE(dtype, call) \
    do {                       \
        if ((dtype) == DTYPE_BF16) { \
            const int dtype_ = DTYPE_BF16; \
            call;              \
        } else {               \
            const int dtype_ = DTYPE_F32; \
            call;              \
        }                      \
    } while (0)

static inline float load(const void *base, long i, int dtype) {
    return dtype == DTYPE_BF16 ? bf16_to_float(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

static inline void store(void *base, long i, float value, int dtype) {
    if (dtype == DTYPE_BF16)
        ((uint16_t *)base)[i] = float_to_bf16(value);
    else
        ((float *)base)[i] = value;
}

static inline size_t element_size(int dtype) { return dtype == DTYPE_BF16 ? 2 : 4; }

/* ---- RMS norm ------------------------------------------------------------------ */

/* Sum of squares of one row in fp64 lanes: vectorised without reassociating fp32 sums,
 * and exact enough that the mean square's only rounding is the final one. */
ROW_FUNCTION double sum_of_squares(const void *row, long hidden, int dtype) {
    double lanes[8] = {0};
    long i = 0;
    for (; i + 8 <= hidden; i += 8)
        SIMD_LOOP
        for (int j = 0; j < 8; j++) {
            double v = load(row, i + j, dtype);
            lanes[j] += v * v;
        }
    for (; i < hidden; i++) {
        double v = load(row, i, dtype);
        lanes[0] += v * v;
    }
    return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

ROW_FUNCTION void rms_norm_row(const void *x, const void *residual, const void *weight, void *out, void *residual_out,
                         long hidden, float eps, int dtype) {
    const void *source = x;
    if (residual != NULL) {
        /* residual_out = x + residual rounded to the dtype; the norm is of that stored sum. */
        SIMD_LOOP
        for (long i = 0; i < hidden; i++)
            store(residual_out, i, load(x, i, dtype) + load(residual, i, dtype), dtype);
        source = residual_out;
    }
    float mean_square = (float)(sum_of_squares(source, hidden, dtype) / (double)hidden);
    float inv_rms = 1.0f / sqrtf(mean_square + eps);
    SIMD_LOOP
    for (long i = 0; i < hidden; i++)
        store(out, i, load(source, i, dtype) * inv_rms * load(weight, i, dtype), dtype);
}

/* out = rms_norm(x) (residual NULL), or residual_out = x + residual and out =
 * rms_norm(residual_out); [rows, hidden] each, weight [hidden]. */
ROW_RANGE rms_norm_rows(const void *x, const void *residual, const void *weight, void *out, void *residual_out,
                        long first, long last, long hidden, float eps, int dtype) {
    size_t row_bytes = (size_t)hidden * element_size(dtype);
    for (long r = first; r < last; r++) {
        size_t offset = (size_t)r * row_bytes;
        const void *residual_row = residual ? (const char *)residual + offset : NULL;
        void *residual_out_row = residual_out ? (char *)residual_out + offset : NULL;
        FOR_DTYPE(dtype, rms_norm_row((const char *)x + offset, residual_row, weight, (char *)out + offset,
                                      residual_out_row, hidden, eps, dtype_));
    }
}

void accord_rms_norm(const void *x, const void *residual, const void *weight, void *out, void *residual_out,
                     long rows, long hidden, float eps, int dtype, int threads) {
    FOR_ROW_RANGES(rows, threads,
                   rms_norm_rows(x, residual, weight, out, residual_out, first_, last_, hidden, eps, dtype));
}

/* ---- rotary embedding ------------------------------------------------------------ */

ROW_FUNCTION void rotate_head(const void *src, void *dst, const float *cos, const float *sin, long half,
                              long head_dim, int is_neox, int dtype) {
    if (is_neox) { /* dim i pairs with i + R/2 */
        SIMD_LOOP
        for (long i = 0; i < half; i++) {
            float a = load(src, i, dtype), b = load(src, i + half, dtype);
            store(dst, i, a * cos[i] - b * sin[i], dtype);
            store(dst, i + half, b * cos[i] + a * sin[i], dtype);
        }
    } else { /* gpt-j: dim 2i pairs with 2i + 1 */
        SIMD_LOOP
        for (long i = 0; i < half; i++) {
            float a = load(src, 2 * i, dtype), b = load(src, 2 * i + 1, dtype);
            store(dst, 2 * i, a * cos[i] - b * sin[i], dtype);
            store(dst, 2 * i + 1, b * cos[i] + a * sin[i], dtype);
        }
    }
    size_t size = element_size(dtype);
    memcpy((char *)dst + 2 * half * size, (const char *)src + 2 * half * size, (size_t)(head_dim - 2 * half) * size);
}

ROW_FUNCTION void rotate_token(const void *query, const void *key, const float *cos, const float *sin,
                               void *query_out, void *key_out, long query_heads, long key_heads, long half,
                               long head_dim, int is_neox, int dtype) {
    size_t head_bytes = (size_t)head_dim * element_size(dtype);
    for (long h = 0; h < query_heads; h++)
        rotate_head((const char *)query + h * head_bytes, (char *)query_out + h * head_bytes, cos, sin, half,
                    head_dim, is_neox, dtype);
    for (long h = 0; h < key_heads; h++)
        rotate_head((const char *)key + h * head_bytes, (char *)key_out + h * head_bytes, cos, sin, half, head_dim,
                    is_neox, dtype);
}

static inline long position_at(const void *positions, long t, int index_is_64) {
    return index_is_64 ? ((const int64_t *)positions)[t] : ((const int32_t *)positions)[t];
}

ROW_RANGE rotary_rows(const void *positions, int index_is_64, const void *query, const void *key,
                      const float *cos_sin_cache, void *query_out, void *key_out, long first, long last,
                      long query_heads, long key_heads, long head_dim, long rotary_dim, int is_neox, int dtype) {
    long half = rotary_dim / 2;
    size_t head_bytes = (size_t)head_dim * element_size(dtype);
    for (long t = first; t < last; t++) {
        const float *cos = cos_sin_cache + position_at(positions, t, index_is_64) * rotary_dim;
        const float *sin = cos + half;
        size_t query_offset = (size_t)t * query_heads * head_bytes, key_offset = (size_t)t * key_heads * head_bytes;
        FOR_DTYPE(dtype, rotate_token((const char *)query + query_offset, (const char *)key + key_offset, cos, sin,
                                      (char *)query_out + query_offset, (char *)key_out + key_offset, query_heads,
                                      key_heads, half, head_dim, is_neox, dtype_));
    }
}

/* query/key [T, H, D] rotated in their first R dims into query_out/key_out by the row
 * cos_sin_cache[positions[t]] (fp32 [P, R]: cos | sin). Returns -1 (writing nothing)
 * when a position is outside [0, P), 0 otherwise. */
int accord_rotary_embedding(const void *positions, int index_is_64, const void *query, const void *key,
                            const float *cos_sin_cache, void *query_out, void *key_out, long tokens,
                            long query_heads, long key_heads, long head_dim, long rotary_dim, long max_positions,
                            int is_neox, int dtype, int threads) {
    for (long t = 0; t < tokens; t++) {
        long position = position_at(positions, t, index_is_64);
        if (position < 0 || position >= max_positions) return -1;
    }
    FOR_ROW_RANGES(tokens, threads,
                   rotary_rows(positions, index_is_64, query, key, cos_sin_cache, query_out, key_out, first_, last_,
                               query_heads, key_heads, head_dim, rotary_dim, is_neox, dtype));
    return 0;
}

/* ---- SiLU and mul ---------------------------------------------------------------- */

/* e^x for x in [-87, 87] (Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-7
 * polynomial for e^r, 2^n put into the exponent bits); about 1 ulp. Written without
 * calls or branches so the loop around it vectorises, which libm's expf does not. */
static inline float exp_in_range(float x) {
    /* n = x / ln2 rounded to nearest by the 1.5 * 2^23 trick (floorf would be a call). */
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#define EXP_RANGE 87.0f

ROW_FUNCTION void silu_and_mul_row(const void *gate, const void *up, void *out, long intermediate, int dtype) {
    int outside = 0;
    _Pragma("omp simd reduction(| : outside)")
    for (long i = 0; i < intermediate; i++) {
        float g = load(gate, i, dtype), minus_g = -g;
        float clamped = minus_g > EXP_RANGE ? EXP_RANGE : minus_g < -EXP_RANGE ? -EXP_RANGE : minus_g;
        outside |= !(fabsf(g) <= EXP_RANGE);
        store(out, i, g / (1.0f + exp_in_range(clamped)) * load(up, i, dtype), dtype);
    }
    if (!outside) return;
    /* Gates outside the polynomial's range (rare): libm's expf, which saturates correctly. */
    for (long i = 0; i < intermediate; i++) {
        float g = load(gate, i, dtype);
        if (!(fabsf(g) <= EXP_RANGE)) store(out, i, g / (1.0f + expf(-g)) * load(up, i, dtype), dtype);
    }
}

ROW_RANGE silu_and_mul_rows(const void *x, void *out, long first, long last, long intermediate, int dtype) {
    size_t size = element_size(dtype);
    for (long r = first; r < last; r++) {
        const char *gate = (const char *)x + (size_t)r * 2 * intermediate * size;
        const char *up = gate + (size_t)intermediate * size;
        char *row_out = (char *)out + (size_t)r * intermediate * size;
        FOR_DTYPE(dtype, silu_and_mul_row(gate, up, row_out, intermediate, dtype_));
    }
}

/* out [T, I] = silu(x[:, :I]) * x[:, I:] for x [T, 2I]. */
void accord_silu_and_mul(const void *x, void *out, long rows, long intermediate, int dtype, int threads) {
    FOR_ROW_RANGES(rows, threads, silu_and_mul_rows(x, out, first_, last_, intermediate, dtype));
}

/* ---- KV cache write -------------------------------------------------------------- */

/* For each token t with slot s = slots[t] >= 0, copy key[t] and value[t] (row_bytes each)
 * to row s of the caches (contiguous [NB * BS] rows of the same dtype). Returns -1
 * (writing nothing) when a slot is >= num_slots, 0 otherwise. */
int accord_reshape_and_cache(const void *key, const void *value, void *key_cache, void *value_cache,
                             const void *slots, int index_is_64, long tokens, long row_bytes, long num_slots) {
    for (long t = 0; t < tokens; t++)
        if (position_at(slots, t, index_is_64) >= num_slots) return -1;
    for (long t = 0; t < tokens; t++) {
        long slot = position_at(slots, t, index_is_64);
        if (slot < 0) continue;
        memcpy((char *)key_cache + (size_t)slot * row_bytes, (const char *)key + (size_t)t * row_bytes, row_bytes);
        memcpy((char *)value_cache + (size_t)slot * row_bytes, (const char *)value + (size_t)t * row_bytes,
               row_bytes);
    }
    return 0;
}

/* out[t] = table[ids[t]] for each of `tokens` ids (rows of row_bytes, any dtype).
 * Returns -1 (writing nothing) when an id is outside [0, num_rows), 0 otherwise. */
int accord_embedding(const void *table, const void *ids, int index_is_64, void *out, long tokens, long row_bytes,
                     long num_rows) {
    for (long t = 0; t < tokens; t++) {
        long id = position_at(ids, t, index_is_64);
        if (id < 0 || id >= num_rows) return -1;
    }
    for (long t = 0; t < tokens; t++)
        memcpy((char *)out + (size_t)t * row_bytes,
               (const char *)table + (size_t)position_at(ids, t, index_is_64) * row_bytes, row_bytes);
    return 0;
}

/* out [rows, row_bytes] (contiguous) = the rows of src, src_stride bytes apart: a view
 * whose rows are each contiguous (a slice of a wider tensor's columns) made contiguous. */
void accord_copy_rows(const void *src, void *out, long rows, long row_bytes, long src_stride) {
    for (long r = 0; r < rows; r++)
        memcpy((char *)out + (size_t)r * row_bytes, (const char *)src + (size_t)r * src_stride, row_bytes);
}
