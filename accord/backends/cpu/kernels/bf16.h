/* bf16 <-> fp32 for the native cpu kernels: a bf16 is the high half of an fp32, so
 * widening is exact; narrowing rounds to nearest even and keeps NaN a (quiet) NaN, as
 * torch's float -> bfloat16 does. */

#ifndef ACCORD_BF16_H
#define ACCORD_BF16_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t float_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    /* Rounding could carry a NaN's payload into infinity: quiet it instead. */
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x0040u);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

#endif
