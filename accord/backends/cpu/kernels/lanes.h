/* The 16-lane fp32 vector the native cpu kernels compute in (GCC's vector extensions:
 * AVX512 or AVX2 code as the host allows, plain C elsewhere), bf16 and fp32 rows read as
 * fp32 lanes, and the fixed-order sum of its lanes that keeps a dot product's result
 * independent of where it is computed. */

#ifndef ACCORD_LANES_H
#define ACCORD_LANES_H

#include <stdint.h>
#include <string.h>
#include "bf16.h"

#define LANES 16

typedef float vfloat __attribute__((vector_size(LANES * 4)));
typedef uint32_t vuint __attribute__((vector_size(LANES * 4)));
typedef uint16_t vhalf __attribute__((vector_size(LANES * 2)));
typedef float vhalf_float __attribute__((vector_size(LANES * 2)));
typedef float vquarter_float __attribute__((vector_size(LANES)));

/* A row's element type, as the kernels' callers pass it. */
enum dtype { FP32 = 0, BF16 = 1 };

/* LANES elements starting at element i of a row of `dtype`, as fp32. */
static inline vfloat load_lanes(const void *row, long i, const int dtype) {
    vfloat v;
    if (dtype == BF16) {
        vhalf h;
        memcpy(&h, (const uint16_t *)row + i, sizeof h);
        vuint wide = __builtin_convertvector(h, vuint) << 16;
        memcpy(&v, &wide, sizeof v);
    } else {
        memcpy(&v, (const float *)row + i, sizeof v);
    }
    return v;
}

/* Element i of a row of `dtype`, as fp32. */
static inline float load_one(const void *row, long i, const int dtype) {
    return dtype == BF16 ? bf16_to_float(((const uint16_t *)row)[i]) : ((const float *)row)[i];
}

/* The sum of v's lanes: halved twice (16 lanes to 8 to 4), the last four added pairwise.
 * A block's row sums are a few dependent vector adds instead of a chain of 16
 * scalar ones, which streamed the 152M decode weights 4-5% faster in the bf16-weight
 * GEMM (one and two threads, alternating in one process). Every caller's sums go
 * through this one order. */
static inline float lane_sum(vfloat v) {
    vhalf_float low, high;
    memcpy(&low, &v, sizeof low);
    memcpy(&high, (const char *)&v + sizeof low, sizeof high);
    vhalf_float half = low + high;
    vquarter_float front, back;
    memcpy(&front, &half, sizeof front);
    memcpy(&back, (const char *)&half + sizeof front, sizeof back);
    vquarter_float quarter = front + back;
    return (quarter[0] + quarter[2]) + (quarter[1] + quarter[3]);
}

#endif
