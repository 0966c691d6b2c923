/* Prefill attention over the paged KV cache, read in place: for every sequence of a
 * varlen step with more than one new query row (a whole prompt, or a chunk of one after
 * a cached prefix), causal (and sliding-window) attention of its rows over its cached
 * positions, the prefix included, with no gather, no cast of the cache and no copy of a
 * kv head per query head.
 *
 * A task is one (sequence, kv head, tile of query positions): the query rows of the
 * head's whole group at those positions (about ROWS_PER_TASK rows) walk the visible keys
 * KEY_TILE positions at a time, flash-style: each key tile is read from the cache once
 * and shared by every row of the task, its scores go through an fp32 online softmax
 * (running maximum and sum per row, the accumulator rescaled when the maximum grows),
 * and the weighted values are summed in fp32. Values are widened to fp32 and the
 * probabilities stay fp32: only the query . key products take the bf16 instruction,
 * whose products of bf16 inputs are exact.
 *
 * Tiles start at fixed multiples of the sequence's own positions and every sum runs in
 * one fixed order, so a sequence's bits do not depend on what else the step holds nor
 * on the thread count: batch invariance per sequence, as in the decode kernel.
 *
 * The query . key products are computed by one of two paths (`isa`): fp32 lanes, with
 * bf16 widened exactly (this is AVX512F or AVX2 code, whichever the host builds under
 * -march=native), or AVX512-BF16's vdpbf16ps on bf16 pairs (bf16 query and cache only;
 * the function carries its own target, so the file builds on any x86 host and the
 * caller picks the path only where the CPU has the instruction). */

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "paged_attention.h"
#include "paged_attention_bf16.h"

/* Key positions per tile: one vector of scores per query row. */
#define KEY_TILE LANES
/* Query rows (positions times the group's heads) per task: enough rows to share each
 * key tile's read among, few enough that the task's state stays in L2. */
#define ROWS_PER_TASK 128
/* Below this many (query row, visible key) pairs in a call, a second thread costs
 * more than it saves. */
#define PAIRS_PER_THREAD 32768

_Static_assert(KEY_TILE == LANES, "a row's tile of scores is one vector");

/* One task's query rows and its fp32 state, in one 64-byte aligned allocation. `q` holds
 * the rows as fp32 (kd each) or as bf16 pairs (kd / 2 uint32 each); `keys` the key tile
 * transposed (channel-major: fp32 [kd][KEY_TILE] or pairs [kd / 2][KEY_TILE]); `values`
 * the value tile widened, [KEY_TILE][vd]; `scores` [rows][KEY_TILE]; `top` and `total`
 * the running maximum per row and its sum (as LANES partial sums, [rows][LANES]: one
 * horizontal sum per row at the end, not per tile); `acc` [rows][vd]. */
struct state {
    void *q, *keys;
    float *values, *scores, *top, *total, *acc;
    long offsets[KEY_TILE];
};

static long aligned(long bytes) { return (bytes + 63) / 64 * 64; }

static void *state_alloc(struct state *s, long rows, long kd, long vd) {
    const long q = aligned(rows * kd * 4), k = aligned(kd * KEY_TILE * 4), v = aligned(KEY_TILE * vd * 4),
               sc = aligned(rows * KEY_TILE * 4), t = aligned(rows * 4), a = aligned(rows * vd * 4);
    char *base = aligned_alloc(64, q + k + v + 2 * sc + t + a);
    if (base == NULL) return NULL;
    s->q = base, s->keys = base + q, s->values = (float *)(base + q + k), s->scores = (float *)(base + q + k + v);
    s->top = (float *)(base + q + k + v + sc), s->total = (float *)(base + q + k + v + sc + t);
    s->acc = (float *)(base + q + k + v + 2 * sc + t);
    return base;
}

/* scores[r][j] = scale * (fp32 query row r . key j) for nb rows (a constant where this
 * is inlined), channels ascending, one chain per key. */
static inline __attribute__((always_inline)) void score_rows_fp32(const float *q, long kd, const float *keys,
                                                                 const int nb, float scale, float *scores) {
    vfloat acc[SCORE_ROWS] = {{0}};
    for (long i = 0; i < kd; ++i) {
        vfloat k;
        memcpy(&k, keys + i * KEY_TILE, sizeof k);
        for (int r = 0; r < nb; ++r) acc[r] += q[r * kd + i] * k;
    }
    for (int r = 0; r < nb; ++r) {
        const vfloat s = acc[r] * scale;
        memcpy(scores + r * KEY_TILE, &s, sizeof s);
    }
}

static void score_fp32(const float *q, long rows, long kd, const float *keys, float scale, float *scores) {
    long r = 0;
    for (; r + SCORE_ROWS <= rows; r += SCORE_ROWS)
        score_rows_fp32(q + r * kd, kd, keys, SCORE_ROWS, scale, scores + r * KEY_TILE);
    for (; r < rows; ++r) score_rows_fp32(q + r * kd, kd, keys, 1, scale, scores + r * KEY_TILE);
}

/* The tile of positions [p0, p0 + KEY_TILE) into the state, channel-major keys and
 * widened values; positions outside [lo, hi) (not visible to any row of the task) are
 * not read and hold zeros. */
static void load_tile(const struct cache *c, int kv_dtype, int isa, const void *table, int index_bytes, long head,
                      long p0, long lo, long hi, struct state *s) {
    const long kd = c->key_dim, vd = c->value_dim, esize = kv_dtype == BF16 ? 2 : 4;
    const long first = p0 > lo ? p0 : lo, end = p0 + KEY_TILE < hi ? p0 + KEY_TILE : hi;
    memset(s->keys, 0, kd * KEY_TILE * 4);
    memset(s->values, 0, KEY_TILE * vd * 4);
    position_offsets(c, table, index_bytes, head, first, end, s->offsets);
    for (long p = first; p < end; ++p) {
        const long j = p - p0, offset = s->offsets[p - first];
        const char *key = (const char *)c->keys + offset * esize, *value = (const char *)c->values + offset * esize;
        if (isa == ISA_AVX512_BF16) {
            uint32_t *keys = s->keys;
            for (long i = 0; i < kd / 2; ++i) memcpy(keys + i * KEY_TILE + j, key + 4 * i, 4);
        } else {
            float *keys = s->keys;
            for (long i = 0; i < kd; ++i) keys[i * KEY_TILE + j] = load_one(key, i, kv_dtype);
        }
        float *row = s->values + j * vd;
        long i = 0;
        for (; i + LANES <= vd; i += LANES) {
            const vfloat v = load_lanes(value, i, kv_dtype);
            memcpy(row + i, &v, sizeof v);
        }
        for (; i < vd; ++i) row[i] = load_one(value, i, kv_dtype);
    }
}

/* acc[r] += sum over the tile's positions j (ascending) of w[r][j] * value row j, for
 * VALUE_ROWS rows at a time, channels four vectors at a time (16 accumulators, each
 * value vector loaded once for the rows), then one vector, then one channel at a time. */
#define VALUE_ROWS 4
static inline __attribute__((always_inline)) void add_values_rows(const float *w, const float *values, long vd,
                                                                 const int nb, float *acc) {
    long i = 0;
    for (; i + 4 * LANES <= vd; i += 4 * LANES) {
        vfloat a[VALUE_ROWS][4];
        for (int r = 0; r < nb; ++r)
            for (int k = 0; k < 4; ++k) a[r][k] = loadv(acc + r * vd + i + k * LANES);
        for (int j = 0; j < KEY_TILE; ++j) {
            const float *v = values + j * vd + i;
            const vfloat v0 = loadv(v), v1 = loadv(v + LANES), v2 = loadv(v + 2 * LANES), v3 = loadv(v + 3 * LANES);
            for (int r = 0; r < nb; ++r) {
                const float weight = w[r * KEY_TILE + j];
                a[r][0] += weight * v0, a[r][1] += weight * v1, a[r][2] += weight * v2, a[r][3] += weight * v3;
            }
        }
        for (int r = 0; r < nb; ++r)
            for (int k = 0; k < 4; ++k) storev(acc + r * vd + i + k * LANES, a[r][k]);
    }
    for (; i + LANES <= vd; i += LANES)
        for (int r = 0; r < nb; ++r) {
            vfloat a = loadv(acc + r * vd + i);
            for (int j = 0; j < KEY_TILE; ++j) a += w[r * KEY_TILE + j] * loadv(values + j * vd + i);
            storev(acc + r * vd + i, a);
        }
    for (; i < vd; ++i)
        for (int r = 0; r < nb; ++r)
            for (int j = 0; j < KEY_TILE; ++j) acc[r * vd + i] += w[r * KEY_TILE + j] * values[j * vd + i];
}

static void add_values(const float *w, long rows, const float *values, long vd, float *acc) {
    long r = 0;
    for (; r + VALUE_ROWS <= rows; r += VALUE_ROWS) add_values_rows(w + r * KEY_TILE, values, vd, VALUE_ROWS, acc + r * vd);
    for (; r < rows; ++r) add_values_rows(w + r * KEY_TILE, values, vd, 1, acc + r * vd);
}

/* One task: query positions [pos0, pos0 + positions) of a sequence of seq_len cached
 * positions (query row row0 holds position pos0), kv head `head`. */
struct prefill_task {
    long seq, row0, pos0, positions;
};

/* What every task of a call shares. */
struct prefill_tasks {
    const struct cache *cache;
    const struct rows *rows;
    int kv_dtype, isa, index_bytes;
    const struct prefill_task *tasks;
    long kv_heads, group, window;
    const void *seq_lens, *block_tables;
    long table_stride;
    float scale;
};

/* Task number `k` (tile k / kv_heads, kv head k % kv_heads); 0, or -1 when its state
 * could not be allocated. */
static int run_prefill_task(const void *tasks, long k) {
    const struct prefill_tasks *w = tasks;
    const struct prefill_task *t = w->tasks + k / w->kv_heads;
    const struct cache *c = w->cache;
    const struct rows *r = w->rows;
    const long head = k % w->kv_heads, group = w->group, rows = t->positions * group;
    const long kd = c->key_dim, vd = c->value_dim, window = w->window;
    const void *table = (const char *)w->block_tables + t->seq * w->table_stride * w->index_bytes;
    struct state s;
    void *memory = state_alloc(&s, rows, kd, vd);
    if (memory == NULL) return -1;
    const long q_size = r->q_dtype == BF16 ? 2 : 4, out_size = r->out_dtype == BF16 ? 2 : 4;
    /* Row m is query position pos0 + m / group, query head head * group + m % group. */
    for (long m = 0; m < rows; ++m) {
        const char *src = (const char *)r->query +
                          ((t->row0 + m / group) * r->q_row_stride + (head * group + m % group) * r->q_head_stride) * q_size;
        if (w->isa == ISA_AVX512_BF16)
            memcpy((uint32_t *)s.q + m * (kd / 2), src, kd * 2);
        else
            for (long i = 0; i < kd; ++i) ((float *)s.q)[m * kd + i] = load_one(src, i, r->q_dtype);
        s.top[m] = -__builtin_inff();
    }
    memset(s.total, 0, rows * LANES * sizeof(float));
    memset(s.acc, 0, rows * vd * sizeof(float));
    const long last = t->pos0 + t->positions - 1; /* the last row's position: keys past it are hidden */
    const long lo = window > 0 && t->pos0 - window + 1 > 0 ? t->pos0 - window + 1 : 0;
    for (long p0 = lo / KEY_TILE * KEY_TILE; p0 <= last; p0 += KEY_TILE) {
        load_tile(c, w->kv_dtype, w->isa, table, w->index_bytes, head, p0, lo, last + 1, &s);
        if (w->isa == ISA_AVX512_BF16)
            score_bf16(s.q, rows, kd / 2, s.keys, w->scale, s.scores);
        else
            score_fp32(s.q, rows, kd, s.keys, w->scale, s.scores);
        for (long m = 0; m < rows; ++m)
            softmax_tile(s.scores + m * KEY_TILE, p0, t->pos0 + m / group, window, s.top + m, s.total + m * LANES,
                         s.acc + m * vd, vd);
        add_values(s.scores, rows, s.values, vd, s.acc);
    }
    for (long m = 0; m < rows; ++m) {
        char *dst = (char *)r->out +
                    ((t->row0 + m / group) * r->out_row_stride + (head * group + m % group) * r->out_head_stride) * out_size;
        const float inv = 1.0f / lane_sum(loadv(s.total + m * LANES));
        for (long i = 0; i < vd; ++i) {
            const float o = s.acc[m * vd + i] * inv;
            if (r->out_dtype == BF16)
                ((uint16_t *)dst)[i] = float_to_bf16(o);
            else
                ((float *)dst)[i] = o;
        }
    }
    free(memory);
    return 0;
}

/* The rows of every sequence of a varlen step with more than one new query row (see the
 * paged_attention contract; struct paged_call is declared in _native_attention.py),
 * `isa` the query . key path (ISA_AVX512_BF16 needs bf16 query and caches, an even key
 * width and the instruction, else the fp32 path runs). The decode kernel has attended
 * the single-row sequences and zeroed the rows no sequence owns. Returns 0, or -1 when
 * the metadata points outside the tensors (having written nothing: the caller's checked
 * path then reports it) or memory ran out (the caller's path then redoes them). */
long accord_paged_prefill_attention(const struct paged_call *call, float scale, long isa) {
    const int index_bytes = (int)call->index_bytes, kv_dtype = (int)call->kv_dtype;
    const long rows = call->rows, q_heads = call->q_heads, num_blocks = call->num_blocks,
               block_size = call->block_size, kv_heads = call->kv_heads, table_width = call->table_width,
               num_seqs = call->num_seqs, window = call->sliding_window, threads = call->threads;
    const void *block_tables = (const void *)call->block_tables, *seq_lens = (const void *)call->seq_lens,
               *query_start_loc = (const void *)call->query_start_loc;
    const long group = q_heads / kv_heads, per_task = ROWS_PER_TASK / group > 0 ? ROWS_PER_TASK / group : 1;
    if (isa == ISA_AVX512_BF16 &&
        (call->q_dtype != BF16 || kv_dtype != BF16 || call->key_dim % 2 || !__builtin_cpu_supports("avx512bf16")))
        isa = ISA_FP32;
    long count = 0;
    for (long b = 0; b < num_seqs; ++b) {
        const long start = read_index(query_start_loc, b, index_bytes);
        const long q_len = read_index(query_start_loc, b + 1, index_bytes) - start;
        if (q_len > 1) count += (q_len + per_task - 1) / per_task;
    }
    struct prefill_task *tasks = malloc(sizeof *tasks * (count + 1));
    if (tasks == NULL) return -1;
    long n = 0, pairs = 0;
    for (long b = 0; b < num_seqs; ++b) {
        const long start = read_index(query_start_loc, b, index_bytes);
        const long q_len = read_index(query_start_loc, b + 1, index_bytes) - start;
        const long len = read_index(seq_lens, b, index_bytes);
        if (q_len <= 1) continue;
        const long cached = len - q_len, blocks = (len + block_size - 1) / block_size;
        if (start < 0 || start + q_len > rows || cached < 0 || blocks > table_width) goto invalid;
        const long lo = window > 0 && cached - window + 1 > 0 ? cached - window + 1 : 0;
        const void *table = (const char *)block_tables + b * call->table_stride * index_bytes;
        for (long k = lo / block_size; k < blocks; ++k) {
            const long block = read_index(table, k, index_bytes);
            if (block < 0 || block >= num_blocks) goto invalid;
        }
        for (long q = 0; q < q_len; q += per_task) {
            const long positions = q + per_task < q_len ? per_task : q_len - q;
            tasks[n++] = (struct prefill_task){b, start + q, cached + q, positions};
        }
        pairs += q_len * (len - lo) * q_heads;
    }
    const struct cache c = {(const void *)call->key_cache, (const void *)call->value_cache, call->block_stride,
                            call->slot_stride, call->head_stride, block_size, call->key_dim, call->value_dim};
    const struct rows r = {(const void *)call->query, (void *)call->out, (int)call->q_dtype, (int)call->out_dtype,
                           call->q_row_stride, call->q_head_stride, call->out_row_stride, call->out_head_stride};
    const struct prefill_tasks work = {&c, &r, kv_dtype, (int)isa, index_bytes, tasks, kv_heads, group, window,
                                       seq_lens, block_tables, call->table_stride, scale};
    const long total = n * kv_heads;
    long wanted = pairs / PAIRS_PER_THREAD;
    if (wanted > threads) wanted = threads;
    if (wanted > total) wanted = total;
    const int failed = run_tasks(run_prefill_task, &work, total, wanted);
    free(tasks);
    return failed ? -1 : 0;
invalid:
    free(tasks);
    return -1;
}
