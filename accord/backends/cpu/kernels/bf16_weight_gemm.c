/* y[M, N] = x[M, K] @ W[N, K]^T (+ bias[N]) with bf16 W, x fp32 or bf16 (`x_bf16`), and
 * bias and y both fp32 or both bf16 (`io_bf16`): each weight element is widened to fp32 exactly (a bf16 is the top half
 * of an fp32), multiplied and accumulated in fp32, so with fp32 activations the result is
 * the fp32 GEMM's up to summation order while the weights stream at half the bytes. With
 * bf16 activations (a CPU that computes bf16 natively) they are widened exactly too, the
 * products are exact in fp32 (8 + 8 significant bits), and the fp32 sum plus bias is
 * rounded once to bf16 (to nearest even): oneDNN's bf16 GEMM's numerics, up to summation
 * order; or kept in fp32 (bf16 x, fp32 y: the LM head's fp32 logits on such a CPU, which
 * oneDNN's bf16 GEMM would round to bf16). bf16 x is widened once per call (`fp32_rows`), not in the tile: widened there,
 * once per block of weight rows, it streamed the 152M Llama's decode weights 0.75-0.8x as
 * fast as fp32 x at 4 rows (one thread), alike at 1 row. Made for few rows (decode),
 * where the GEMM is bound by the weight stream; built by _native_gemm.py with
 * -march=native, so GCC's vector extensions below become AVX512 or AVX2 code as the host
 * allows: widening and fp32 FMAs, also on CPUs with AVX512-BF16. Its dot product
 * (vdpbf16ps) is not used: it would take bf16 pairs of K in another tile, and could be
 * neither timed nor checked on the hosts this was written on (none had it).
 *
 * Weight layout (written once at load by accord_pack_bf16_weight): the rows go in blocks
 * of ROWS_PER_BLOCK; a block holds its rows' first LANES columns row after row, then
 * their next LANES columns, and so on, then each row's last K % LANES columns; the last
 * N % ROWS_PER_BLOCK rows are blocks of one row (a one-row block is the plain row). A
 * block is thus one contiguous stream read front to back, in exactly the order the
 * kernel consumes it. On the plain [N, K] layout a block was ROWS_PER_BLOCK interleaved
 * streams 2K bytes apart, which the hardware prefetchers follow badly: the blocked
 * layout with a software prefetch a fixed PREFETCH_BYTES ahead streamed the 152M bench
 * Llama's decode weights (1 row, one thread, CPU time on a busy 2-core AVX512 Xeon)
 * 1.2x faster than the plain layout with its next-block prefetch, and bit for bit alike.
 *
 * Work split: inside a block, x is taken TILE_M rows at a time so the block's weights (a
 * few KiB, in L1) are read from memory once whatever M is. The blocks are cut into chunks
 * of about CHUNK_BYTES of weights, and the chunks into one contiguous range per thread of
 * the call. A thread claims the chunks of its own range front to back from that range's
 * counter, so it streams one run of memory and its prefetch runs on into its own next
 * chunk; then it helps with what is left of the other ranges. Dynamic claims keep the
 * work of a thread the OS runs late (a busy host) or that wakes late going to the others,
 * and the call never waits for a thread that has claimed no chunk (the thread pool
 * below). With one shared counter instead, the two threads took alternate chunks, and one
 * thread reading every other 64 KiB chunk (their pattern) streamed 0.9x as fast as
 * reading them in order (one thread, CPU time, the 152M decode weights). Every output
 * element is computed by the same code whichever thread runs it, so the result does not
 * depend on the split or the thread count (batch invariance).
 *
 * Two streams: at one or two rows of x (PAIRED_TILE_M; more need more accumulators than
 * AVX512 has registers) a chunk's full blocks are read in pairs, the i-th of its first
 * half beside the i-th of its second, LANES columns of each in turn, so two runs of
 * memory some KiB apart are in flight per thread instead of one. At one row on the 152M
 * decode shapes (a sweep of its 48 projections and the LM head, one thread, the two
 * kernels alternating in one process on a shared 2-core AVX512 Xeon, 80 sweeps each)
 * that streamed 8.1 GB/s against 7.5 at the quartile of the sweeps' rates, and bit for
 * bit alike; a plain read of memory measured the same gain from a second stream.
 *
 * Prefetch: PREFETCH_BYTES ahead of the read position, into L1. With the two streams and
 * the lane sums below, L1 at 2 KiB streamed the 152M decode sweep 1.1x as fast as the
 * earlier L2 at 4 KiB (14.3 vs 12.7 GB/s at the quartile, two threads; 7.0 vs 6.4 on
 * one; 60 and 40 sweeps alternating in one process), 3 and 4 KiB into L1 alike, 1 KiB
 * less; into L2 with one stream, 4 KiB had measured best of 2-8 KiB, a non-temporal
 * prefetch 0.75x, none 0.7x, and one prefetch per 4 KiB page (leaving the rest to the
 * hardware's streamer) 0.7x. */

#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include "bf16.h"
#include "lanes.h"

#define ROWS_PER_BLOCK 4
#define TILE_M 4
#define CHUNK_BYTES (64 * 1024)
#define PREFETCH_BYTES 2048
#define MAX_STREAMS 2
#define PAIRED_TILE_M 2

static inline vfloat load_floats(const float *p) {
    vfloat v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Sixteen bf16 values widened to fp32: the bf16 bits become the high half. With AVX512
 * that is one zero-extending load of all sixteen: GCC lowers the generic conversion
 * below as two 8-lane ones and an insert (tuned for 256-bit vectors even with
 * -march=native on AVX512 hosts), three shuffle-port uops per load where the tile has
 * few to spare. Bit for bit alike; on the 152M decode sweep (one row, the two forms
 * alternating in one process on a 2-core AVX512 Xeon busy with other work) the one
 * load streamed 5-12% faster at the quartile of the sweeps' rates, on one thread and
 * on two. */
static inline vfloat load_bf16(const uint16_t *p) {
#ifdef __AVX512F__
    __m512i wide = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16);
#else
    vhalf h;
    memcpy(&h, p, sizeof h);
    vuint wide = __builtin_convertvector(h, vuint) << 16;
#endif
    vfloat v;
    memcpy(&v, &wide, sizeof v);
    return v;
}

/* `streams` blocks (wb[s], rows weight rows each from row n0[s], in the blocked layout)
 * against tile_m x rows from m0 (fp32), bias and y of the element type io_bf16 says. The
 * blocks are read side by side, LANES columns of each in turn, so `streams` separate runs
 * of memory are in flight at once. Every count is a compile-time constant where this is
 * inlined, so the accumulators stay in registers; each output element is summed in the
 * same order whatever `streams` is. */
static inline __attribute__((always_inline)) void tile(
    const float *x, const uint16_t *const *wb, const long *n0, const void *bias, void *y, long K, long ldx,
    long ldy, long m0, const int streams, const int rows, const int tile_m, const int io_bf16) {
    vfloat acc[TILE_M][MAX_STREAMS][ROWS_PER_BLOCK];
    const uint16_t *p[MAX_STREAMS];
    for (int s = 0; s < streams; ++s) {
        p[s] = wb[s];
        for (int m = 0; m < tile_m; ++m)
            for (int r = 0; r < rows; ++r) acc[m][s][r] = (vfloat){0};
    }
    long k = 0;
    for (; k + LANES <= K; k += LANES) {
        vfloat wv[MAX_STREAMS][ROWS_PER_BLOCK];
        for (int s = 0; s < streams; ++s) {
            for (int line = 0; line < rows * LANES * 2; line += 64)
                __builtin_prefetch((const char *)p[s] + PREFETCH_BYTES + line, 0, 3);
            for (int r = 0; r < rows; ++r) wv[s][r] = load_bf16(p[s] + r * LANES);
            p[s] += rows * LANES;
        }
        for (int m = 0; m < tile_m; ++m) {
            vfloat xv = load_floats(x + (m0 + m) * ldx + k);
            for (int s = 0; s < streams; ++s)
                for (int r = 0; r < rows; ++r) acc[m][s][r] += xv * wv[s][r];
        }
    }
    long tail = K - k; /* each row's last columns, row after row, at p[s] */
    for (int s = 0; s < streams; ++s) {
        for (int m = 0; m < tile_m; ++m) {
            for (int r = 0; r < rows; ++r) {
                float sum = lane_sum(acc[m][s][r]);
                for (long t = 0; t < tail; ++t) sum += x[(m0 + m) * ldx + k + t] * bf16_to_float(p[s][r * tail + t]);
                long n = n0[s] + r, at = (m0 + m) * ldy + n;
                if (io_bf16) {
                    if (bias) sum += bf16_to_float(((const uint16_t *)bias)[n]);
                    ((uint16_t *)y)[at] = float_to_bf16(sum);
                } else {
                    if (bias) sum += ((const float *)bias)[n];
                    ((float *)y)[at] = sum;
                }
            }
        }
    }
}

/* One tile with its counts and element type as constants (tile_m is 1..TILE_M and
 * io_bf16 0 or 1 at run time). */
#define TILE_ROWS(wb, n, streams, rows, io)                                        \
    switch (tile_m) {                                                              \
    case 1: tile(x, wb, n, bias, y, K, ldx, ldy, m0, streams, rows, 1, io); break; \
    case 2: tile(x, wb, n, bias, y, K, ldx, ldy, m0, streams, rows, 2, io); break; \
    case 3: tile(x, wb, n, bias, y, K, ldx, ldy, m0, streams, rows, 3, io); break; \
    default: tile(x, wb, n, bias, y, K, ldx, ldy, m0, streams, rows, 4, io); break; \
    }
#define TILE_CASES(wb, n, streams, rows)                                           \
    if (io_bf16) {                                                                 \
        TILE_ROWS(wb, n, streams, rows, 1)                                         \
    } else {                                                                       \
        TILE_ROWS(wb, n, streams, rows, 0)                                         \
    }

/* One GEMM call: its operands and its chunking (CHUNK_BYTES of weights per chunk). */
struct gemm {
    const float *x; /* fp32 (bf16 x is widened first) */
    const uint16_t *w;
    const void *bias; /* bias and y: fp32, or bf16 where io_bf16 */
    void *y;
    long M, N, K, ldx, ldy;
    int io_bf16;
    long blocks, per_chunk, chunks;
    int helpers; /* pool workers allowed to join: threads - 1 */
};

/* The first chunk of range r; there is one range per thread of the call (helpers + 1),
 * and range r ends where range r + 1 starts. */
static inline long range_start(const struct gemm *g, int r) { return g->chunks * r / (g->helpers + 1); }

static void run_chunk(const struct gemm *g, long c) {
    const float *x = g->x;
    const void *bias = g->bias;
    const uint16_t *w = g->w;
    void *y = g->y;
    const int io_bf16 = g->io_bf16;
    long M = g->M, N = g->N, K = g->K, ldx = g->ldx, ldy = g->ldy;
    long first = c * g->per_chunk;
    long end = first + g->per_chunk < g->blocks ? first + g->per_chunk : g->blocks;
    /* The chunk's full blocks in pairs, the i-th of its first half with the i-th of its
     * second: two streams of weights in flight instead of one (see MAX_STREAMS). */
    long full = end < N / ROWS_PER_BLOCK ? end : N / ROWS_PER_BLOCK;
    long half = full > first ? (full - first) / 2 : 0;
    for (long i = 0; i < half; ++i) {
        const long n0[2] = {(first + i) * ROWS_PER_BLOCK, (first + half + i) * ROWS_PER_BLOCK};
        const uint16_t *const wb[2] = {w + n0[0] * K, w + n0[1] * K};
        for (long m0 = 0; m0 < M; m0 += TILE_M) {
            int tile_m = M - m0 < TILE_M ? (int)(M - m0) : TILE_M;
            if (tile_m <= PAIRED_TILE_M) {
                TILE_CASES(wb, n0, 2, ROWS_PER_BLOCK)
            } else { /* one block after the other: one instantiation of the switch, not two
                      * (the library builds ~1.4x as fast, a cold start-up's compile) */
                for (int s = 0; s < 2; ++s) {
                    TILE_CASES(wb + s, n0 + s, 1, ROWS_PER_BLOCK)
                }
            }
        }
    }
    for (long b = first + 2 * half; b < end; ++b) {
        long n0 = b * ROWS_PER_BLOCK;
        for (long m0 = 0; m0 < M; m0 += TILE_M) {
            int tile_m = M - m0 < TILE_M ? (int)(M - m0) : TILE_M;
            if (N - n0 >= ROWS_PER_BLOCK) {
                const uint16_t *const wb = w + n0 * K;
                TILE_CASES(&wb, &n0, 1, ROWS_PER_BLOCK)
            } else { /* the one-row blocks after the full ones, from row n0's offset too */
                for (long n = n0; n < N; ++n) {
                    const uint16_t *const wb = w + n * K;
                    TILE_CASES(&wb, &n, 1, 1)
                }
            }
        }
    }
}

/* The thread pool. The caller publishes a job and works through its chunks itself;
 * helper threads claim chunks as they happen to run. At the end the caller waits only for
 * chunks a helper has claimed and not yet finished, never for a helper to arrive: on a
 * busy host the OS may not run a helper for milliseconds, and an OpenMP region's join
 * would wait for it (a 0.6 ms GEMM took 6 ms with another process on one of two cores).
 *
 * Each range's `ticket` packs the job's generation (high 32 bits) and the range's next
 * unclaimed chunk (low 32 bits), so a claim (a compare-and-swap) succeeds only on the job
 * it read: a helper that wakes late, after its job ended and the next began, cannot take
 * a chunk of the new job with the old job's operands. The operands are copied between
 * two reads of range 0's ticket and used only if a claim succeeds: a new job first
 * retires every ticket, then rewrites them.
 * Helpers spin about SPIN_NS for the next job, then sleep on a condition variable: a
 * decode step's GEMMs come a few hundred microseconds apart (the glue between them), and
 * with an 80 us spin the helpers slept and woke too late to help (152M decode 69 vs 46
 * ms/token on a quiet 2-core host); 2 ms spans the gaps (43 vs 44). The pool belongs to
 * one process: after a fork (the multiprocess executor forks) the child finds a different
 * pid and starts a new pool. */

#define MAX_HELPERS 255
#define SPIN_NS 2000000L

static struct {
    pid_t pid;
    int started;                       /* helpers created in this process */
    pthread_t threads[MAX_HELPERS];
    pthread_mutex_t lock;              /* guards sleeping helpers' wake-up */
    pthread_cond_t wake;
    /* Each shared counter on its own cache line: helpers spinning on `published` must
     * not pull the line the claims and completions write to. */
    struct gemm job __attribute__((aligned(64))); /* the current job's operands */
    /* Per range: generation << 32 | its next chunk (atomic), each on its own line. */
    struct { uint64_t value __attribute__((aligned(64))); } ticket[MAX_HELPERS + 1];
    long done __attribute__((aligned(64)));       /* chunks of the current job finished (atomic) */
    unsigned published __attribute__((aligned(64))); /* jobs published (atomic) */
    int sleepers __attribute__((aligned(64)));    /* helpers asleep or about to sleep (atomic) */
    int owner;                                    /* a caller is using the pool (atomic) */
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Claims and runs chunks of the job of generation `generation` until none is left:
 * first those of its own range (`self`: 0 for the caller, helper index + 1), front to back,
 * then what is left of the other ranges in turn. The job's operands are copied between
 * two reads of range 0's ticket (a seqlock: a new job retires every ticket before it
 * rewrites them), and a claim succeeds only while its range's ticket is of this job. */
static void work(unsigned generation, int self) {
    uint64_t seen = __atomic_load_n(&pool.ticket[0].value, __ATOMIC_ACQUIRE);
    if ((unsigned)(seen >> 32) != generation || (seen & 0xFFFFFFFFu) == 0xFFFFFFFFu) return;
    struct gemm job = pool.job;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if ((unsigned)(__atomic_load_n(&pool.ticket[0].value, __ATOMIC_RELAXED) >> 32) != generation) return;
    int ranges = job.helpers + 1;
    if (self >= ranges) return;
    for (int visited = 0; visited < ranges; ++visited) {
        int r = (self + visited) % ranges;
        long end = range_start(&job, r + 1);
        for (;;) {
            uint64_t ticket = __atomic_load_n(&pool.ticket[r].value, __ATOMIC_ACQUIRE);
            long chunk = (long)(ticket & 0xFFFFFFFFu);
            if ((unsigned)(ticket >> 32) != generation) return;
            if (chunk >= end) break;
            if (!__atomic_compare_exchange_n(&pool.ticket[r].value, &ticket, ticket + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                continue;
            run_chunk(&job, chunk);
            __atomic_fetch_add(&pool.done, 1, __ATOMIC_RELEASE);
        }
    }
}

static void *helper_main(void *arg) {
    int helper = (int)(intptr_t)arg;
    unsigned seen = __atomic_load_n(&pool.published, __ATOMIC_ACQUIRE);
    for (;;) {
        long start = now_ns();
        int spins = 0;
        while (__atomic_load_n(&pool.published, __ATOMIC_ACQUIRE) == seen) {
            cpu_relax();
            if (++spins % 256 == 0 && now_ns() - start > SPIN_NS) {
                pthread_mutex_lock(&pool.lock);
                __atomic_fetch_add(&pool.sleepers, 1, __ATOMIC_SEQ_CST);
                while (__atomic_load_n(&pool.published, __ATOMIC_SEQ_CST) == seen)
                    pthread_cond_wait(&pool.wake, &pool.lock);
                __atomic_fetch_sub(&pool.sleepers, 1, __ATOMIC_SEQ_CST);
                pthread_mutex_unlock(&pool.lock);
                break;
            }
        }
        seen = __atomic_load_n(&pool.published, __ATOMIC_ACQUIRE);
        work((unsigned)(__atomic_load_n(&pool.ticket[0].value, __ATOMIC_ACQUIRE) >> 32), helper + 1);
    }
    return 0;
}

/* Makes sure `helpers` helpers exist in this process (a forked child starts afresh);
 * returns how many there are (fewer if the OS refuses threads). */
static int ensure_helpers(int helpers) {
    if (helpers > MAX_HELPERS) helpers = MAX_HELPERS;
    while (pool.started < helpers) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&pool.threads[pool.started], &attr, helper_main, (void *)(intptr_t)pool.started);
        pthread_attr_destroy(&attr);
        if (failed) break;
        ++pool.started;
    }
    return pool.started < helpers ? pool.started : helpers;
}

/* x [M, K] (row stride ldx) as fp32 rows, and their row stride in *ld: x itself, or bf16
 * x widened into this thread's buffer (grown as needed, kept for the next call); NULL
 * when that buffer cannot be had. */
static const float *fp32_rows(const void *x, long M, long K, long ldx, int x_bf16, long *ld) {
    static __thread float *buffer;
    static __thread long capacity;
    *ld = ldx;
    if (!x_bf16) return x;
    if (M * K > capacity) {
        float *grown = realloc(buffer, M * K * sizeof(float));
        if (!grown) return NULL;
        buffer = grown;
        capacity = M * K;
    }
    for (long m = 0; m < M; ++m) {
        const uint16_t *from = (const uint16_t *)x + m * ldx;
        float *to = buffer + m * K;
        long k = 0;
        for (; k + LANES <= K; k += LANES) {
            vfloat v = load_bf16(from + k);
            memcpy(to + k, &v, sizeof v);
        }
        for (; k < K; ++k) to[k] = bf16_to_float(from[k]);
    }
    *ld = K;
    return buffer;
}

/* The GEMM on fp32 x, with bias and y as io_bf16 says. */
static void gemm(
    const float *x, const uint16_t *w, const void *bias, void *y,
    long M, long N, long K, long ldx, long ldy, int threads, int io_bf16) {
    struct gemm job = {.x = x, .w = w, .bias = bias, .y = y, .M = M, .N = N, .K = K, .ldx = ldx, .ldy = ldy,
                       .io_bf16 = io_bf16};
    job.blocks = (N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    job.per_chunk = CHUNK_BYTES / (ROWS_PER_BLOCK * K * 2);
    if (job.per_chunk < 1) job.per_chunk = 1;
    job.chunks = (job.blocks + job.per_chunk - 1) / job.per_chunk;
    job.helpers = (job.chunks < threads ? (int)job.chunks : threads) - 1;
    pid_t pid = getpid();
    if (pool.pid != pid) { /* a new process (a forked child has no helper threads) */
        pool.pid = pid;
        pool.started = 0;
        pool.sleepers = 0;
        pool.owner = 0;
        pthread_mutex_init(&pool.lock, 0);
        pthread_cond_init(&pool.wake, 0);
    }
    /* One caller at a time uses the pool; a concurrent caller (another Python thread)
     * runs its chunks alone, which gives the same bits. */
    if (job.helpers < 1 || job.chunks >= 0xFFFFFFFFL || __atomic_exchange_n(&pool.owner, 1, __ATOMIC_ACQUIRE)) {
        for (long c = 0; c < job.chunks; ++c) run_chunk(&job, c);
        return;
    }
    job.helpers = ensure_helpers(job.helpers);
    unsigned generation = (unsigned)(__atomic_load_n(&pool.ticket[0].value, __ATOMIC_RELAXED) >> 32) + 1;
    /* Retire the previous job's tickets (every range a helper of this process may have
     * read) before its operands are overwritten: a helper the OS paused between reading
     * a ticket and claiming with it (a busy host) then fails its claim, instead of running
     * a chunk of a half-written job and counting it as done for this one. The new
     * generation's tickets say "no chunk" until the job is whole. */
    for (int r = 0; r <= pool.started; ++r)
        __atomic_store_n(&pool.ticket[r].value, (uint64_t)generation << 32 | 0xFFFFFFFFu, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    pool.job = job;
    __atomic_store_n(&pool.done, 0, __ATOMIC_RELAXED);
    /* Range 0's ticket last: it is the one helpers check the job by. */
    for (int r = job.helpers; r >= 0; --r)
        __atomic_store_n(&pool.ticket[r].value, (uint64_t)generation << 32 | (uint64_t)range_start(&job, r), __ATOMIC_RELEASE);
    __atomic_fetch_add(&pool.published, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&pool.sleepers, __ATOMIC_SEQ_CST) > 0) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.lock);
    }
    work(generation, 0);
    /* Every chunk is claimed: wait for those a helper is still running, yielding the core
     * now and then in case that helper is waiting for one. */
    for (int spins = 0; __atomic_load_n(&pool.done, __ATOMIC_ACQUIRE) < job.chunks; ++spins) {
        cpu_relax();
        if (spins % 1024 == 1023) sched_yield();
    }
    __atomic_store_n(&pool.owner, 0, __ATOMIC_RELEASE);
}

/* The GEMM on a weight packed by accord_pack_bf16_weight; x is fp32 (x_bf16 0) or bf16
 * (1), bias and y fp32 (io_bf16 0) or bf16 (1), ldx and ldy their row strides in
 * elements. Returns 0, or 1 when bf16 x could not be widened (out of memory: nothing
 * computed). */
int accord_bf16_weight_gemm(
    const void *x, const uint16_t *w, const void *bias, void *y,
    long M, long N, long K, long ldx, long ldy, int threads, int x_bf16, int io_bf16) {
    long ld;
    const float *rows = fp32_rows(x, M, K, ldx, x_bf16, &ld);
    if (!rows) return 1;
    gemm(rows, w, bias, y, M, N, K, ld, ldy, threads, io_bf16);
    return 0;
}

/* Writes W [N, K] into dst in the blocked layout above, as bf16: src is bf16 (src_fp32
 * 0) or fp32 (1), whose high halves are taken. Returns 1 when every low half is zero,
 * i.e. the fp32 values are exactly bf16 and dst loses nothing (always for bf16), else 0.
 * One pass and no temporaries: it runs over every weight at load. */
int accord_pack_bf16_weight(const void *src, int src_fp32, uint16_t *dst, long N, long K, int threads) {
    long full = N / ROWS_PER_BLOCK, steps = K / LANES, tail = K - steps * LANES;
    uint32_t low = 0;
#pragma omp parallel for schedule(static) reduction(| : low) num_threads(threads)
    for (long n = 0; n < N; ++n) {
        long b = n / ROWS_PER_BLOCK;
        /* Row n's place in its block: the block's row count and n's index in it. */
        int rows = b < full ? ROWS_PER_BLOCK : 1, r = b < full ? (int)(n % ROWS_PER_BLOCK) : 0;
        uint16_t *block = dst + (b < full ? b * ROWS_PER_BLOCK : n) * K;
        /* Each LANES-column slice of the row to its place; the last K % LANES columns after all slices. */
        for (long k = 0; k < K; k += LANES) {
            long width = k + LANES <= K ? LANES : tail;
            uint16_t *to = block + (k + LANES <= K ? (k / LANES * rows + r) * LANES : steps * LANES * rows + r * tail);
            if (src_fp32) {
                const uint32_t *from = (const uint32_t *)src + n * K + k;
                for (long j = 0; j < width; ++j) {
                    to[j] = (uint16_t)(from[j] >> 16);
                    low |= from[j] & 0xFFFFu;
                }
            } else {
                memcpy(to, (const uint16_t *)src + n * K + k, width * 2);
            }
        }
    }
    return low == 0;
}
