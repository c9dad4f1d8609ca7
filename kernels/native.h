/* What kernels/native.c and the models' C steps (models/native/) share: the vectorizable e^x and softplus, the vector
 * types, the status codes, and native.c's entry points (the recurrences, which the steps run one token at a time). */
#ifndef SEQMIX_NATIVE_H
#define SEQMIX_NATIVE_H

#include <stdint.h>
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

/* What every entry point of native.c and models/native/ returns: 0, or why it did not run (its outputs unwritten).
 * kernels/native.py's STATUS mirrors these codes (a test checks) and raises on any other than STATUS_OK. */
enum status { STATUS_OK = 0, STATUS_NO_MEMORY = 1, STATUS_HEAD_SIZE = 2 };

#define VEC 16
typedef float vfloat __attribute__((vector_size(VEC * sizeof(float))));
typedef float vfloat_u __attribute__((vector_size(VEC * sizeof(float)), aligned(sizeof(float))));  /* unaligned */
typedef int32_t vint __attribute__((vector_size(VEC * sizeof(int32_t))));
#define LOADV(p) (*(const vfloat_u *)(p))
#define STOREV(p, x) (*(vfloat_u *)(p) = (x))

/* The entry points of native.c (which documents them), as kernels/native.py's ENTRIES writes them: a test checks
 * that the two declare the same prototypes. */
int exp_array(int64_t n, const float *x, float *out);
int softplus_array(int64_t n, const float *x, float *out);
int sum_rows(int64_t first, int64_t last, int64_t rows, int64_t cols, const float *in, float *out);
int wkv4_forward(int64_t first, int64_t last, int64_t T, int64_t C, int64_t block,
                 const float *w, const float *u, const float *k, const float *v, float *y,
                 const float *num0, const float *den0, const float *max0, float *num_out, float *den_out,
                 float *max_out, float *lag_out, int32_t *bad_out, float *vy_save, float *d_save, float *z_save);
int wkv4_backward(int64_t first, int64_t last, int64_t T, int64_t C, int64_t block,
                  const float *w, const float *u, const float *k, const float *v,
                  const float *vy_save, const float *d_save, const float *z_save, const float *gy,
                  const float *num0, const float *den0, const float *max0, const float *num, const float *den,
                  const float *lag_in, const int32_t *bad, const float *gnum, const float *gden, const float *gmax,
                  float *gk, float *gv, float *gw_out, float *gu_out, float *gnum0, float *gden0, float *gmax0);
int64_t selective_scan_lanes(void);
int selective_scan_forward(int64_t first, int64_t last, int64_t D, int64_t T, int64_t N, int64_t delta_softplus,
                           const float *u, const float *delta, const float *delta_bias, const float *A,
                           const float *Bt, const float *Ct, const float *Dskip, const float *z, float *y,
                           float *state, int64_t ck, float *ckpt, int32_t *bad_out);
int selective_scan_backward(int64_t first, int64_t last, int64_t D, int64_t T, int64_t N, int64_t delta_softplus,
                            int64_t per_group, const float *u, const float *delta, const float *delta_bias,
                            const float *A, const float *Bt, const float *Ct, const float *Dskip, const float *z,
                            int64_t ck, const float *ckpt, const int32_t *bad_in, const float *dy,
                            const float *dlast, float *du, float *ddelta, float *dz, float *dA_part,
                            float *dB_part, float *dC_part, float *dD_part, float *dbias_part, float *dstate);
int64_t wkv7_padded_size(int64_t N);
int64_t wkv7_max_head_size(void);
int wkv7_forward(int64_t first, int64_t last, int64_t T, int64_t H, int64_t N,
                 const float *r, const float *log_w, const float *k, const float *v, const float *a,
                 const float *b, float *y, float *state, int64_t ck, float *ckpt, int32_t *bad_out);
int wkv7_backward(int64_t first, int64_t last, int64_t T, int64_t H, int64_t N,
                  const float *r, const float *log_w, const float *k, const float *v, const float *a,
                  const float *b, const float *dy, const float *dstate, int64_t ck, const float *ckpt,
                  const int32_t *bad, float *dr, float *dlog_w, float *dk, float *dv, float *da, float *db,
                  float *dstate0);

#endif
