/* What every op's C loops (kernels/<op>/<op>.c), kernels/native.c and the models' C steps (models/<model>/) share:
 * the vectorizable e^x and softplus, the vector types, the status codes, the scratch buffers, and native.c's entry
 * points. */
#ifndef SEQMIX_NATIVE_H
#define SEQMIX_NATIVE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* 1 when x is NaN or +-inf (exponent bits all set). The loops are compiled assuming finite numbers (see
 * kernels/native.py), under which comparisons and min/max no longer carry a NaN through, so a non-finite input is
 * caught by this integer test, which the compiler cannot fold away, and marks what it reaches as NaN. */
static inline int32_t nonfinite(float x)
{
    int32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return (bits & 0x7f800000) == 0x7f800000;
}

/* x, or NaN when poisoned (an integer select: not subject to the finite-math assumption either) */
static inline float poison(float x, int32_t poisoned)
{
    int32_t bits;
    memcpy(&bits, &x, sizeof bits);
    bits = poisoned ? 0x7fc00000 : bits;
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* 1 when x is NaN or +inf; -inf passes. Where a number is an exponent (WKV-4's keys and state max), -inf means a
 * weight of exactly 0 ("nothing seen yet" for the max), which the loops compute as e^-87 against terms of e^0: the
 * other backends' answer to fp32's resolution. */
static inline int32_t is_minus_inf(float x)
{
    int32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits == (int32_t)0xff800000;
}

static inline int32_t nan_or_plus_inf(float x)
{
    return nonfinite(x) & !is_minus_inf(x);
}

/* 1 when x is NaN (the same integer test) */
static inline int32_t is_nan(float x)
{
    int32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return (bits & 0x7fffffff) > 0x7f800000;
}

/* max(x, 0), NaN kept as torch.relu keeps it: `x > 0 ? x : 0` alone gives 0 for a NaN (in IEEE arithmetic too) */
static inline float relu(float x)
{
    return poison(x > 0.0f ? x : 0.0f, is_nan(x));
}

/* e^x in fp32 within 1 ulp (0.89 measured), vectorizable (no calls, no branches), for x clamped to [-87, 88]:
 * e^-87 is about the smallest normal fp32 number (denormals would slow x86 down by 100x; a factor that small times
 * anything here is below fp32's resolution next to the terms it is added to), e^88 about the largest.
 * x = n ln2 + r with |r| <= ln2/2 (ln2 split in two so that n ln2 is exact), e^r by its degree-7 Taylor polynomial
 * (remainder r^8/8! < 5e-9), then 2^n put in the exponent bits. */
static inline float exp_clamped(float x)
{
    x = x > -87.0f ? (x < 88.0f ? x : 88.0f) : -87.0f;
    const float y = x * 1.44269504f;
    const float n = (float)(int)(y + (y < 0.0f ? -0.5f : 0.5f));   /* round(x / ln2), in [-126, 127] */
    const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;                  /* 2^n, a normal number */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* softplus(x) = log(1 + e^x) = max(x, 0) + log1p(e^-|x|), vectorizable. With m = e^-|x| in (0, 1],
 * log1p(m) = 2 atanh(s) = 2 (s + s^3/3 + ... + s^13/13) for s = m / (2 + m) in (0, 1/3]; the terms left out are below
 * 1e-8 of the sum, and a small m loses nothing (s ~ m/2). Above x = 87 it returns x, as torch's softplus does above
 * its threshold. */
static inline float softplus(float x)
{
    const float m = exp_clamped(x < 0.0f ? x : -x), s = m / (2.0f + m), s2 = s * s;
    float p = 1.0f / 13.0f;
    p = p * s2 + 1.0f / 11.0f;
    p = p * s2 + 1.0f / 9.0f;
    p = p * s2 + 1.0f / 7.0f;
    p = p * s2 + 1.0f / 5.0f;
    p = p * s2 + 1.0f / 3.0f;
    p = p * s2 + 1.0f;
    return (x > 0.0f ? x : 0.0f) + 2.0f * s * p;
}

/* 1 / (1 + e^-x), vectorizable; NaN for a NaN x (exp_clamped's clamp would make it 1 or 0) */
static inline float sigmoid(float x)
{
    return poison(1.0f / (1.0f + exp_clamped(-x)), is_nan(x));
}

/* silu(x) = x / (1 + e^-x); NaN for x = -inf, as in IEEE arithmetic (-inf e^-inf), where e^-x is clamped here */
static inline float silu(float x)
{
    return poison(x / (1.0f + exp_clamped(-x)), is_minus_inf(x));
}

/* What every entry point of the kernels' and the models' C code returns: 0, or why it did not run (its outputs
 * unwritten).
 * kernels/native.py's STATUS mirrors these codes (a test checks) and raises on any other than STATUS_OK. */
enum status { STATUS_OK = 0, STATUS_NO_MEMORY = 1, STATUS_HEAD_SIZE = 2 };

#define VEC 16
typedef float vfloat __attribute__((vector_size(VEC * sizeof(float))));
typedef float vfloat_u __attribute__((vector_size(VEC * sizeof(float)), aligned(sizeof(float))));  /* unaligned */
typedef int32_t vint __attribute__((vector_size(VEC * sizeof(int32_t))));
#define LOADV(p) (*(const vfloat_u *)(p))
#define STOREV(p, x) (*(vfloat_u *)(p) = (x))

/* A buffer of n floats for one call's work items (freed by the caller), 64-byte aligned; NULL when out of memory
 * (the entry point then returns STATUS_NO_MEMORY). */
static inline float *scratch_floats(int64_t n)
{
    return aligned_alloc(64, (size_t)((n * (int64_t)sizeof(float) + 63) / 64 * 64));
}

/* The sum of x[0 .. 7] as a tree of pairs: a few shuffles of one vector (GCC adds the lanes of a reduction's vector
 * one after the other, a chain of 7 dependent additions) */
static inline float sum8(float *x)
{
    for (int64_t half = 4; half > 0; half /= 2)
        for (int64_t l = 0; l < half; l++)
            x[l] += x[l + half];
    return x[0];
}

/* The entry points of native.c (which documents them), as kernels/native.py's ENTRIES reads them: the helpers that
 * every op's loops share; each op's own entry points are in its package's header (kernels/<op>/<op>.h). */
int exp_array(int64_t n, const float *x, float *out);
int softplus_array(int64_t n, const float *x, float *out);
int sum_rows(int64_t first, int64_t last, int64_t rows, int64_t cols, const float *in, float *out);

#endif
