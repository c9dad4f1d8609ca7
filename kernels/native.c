/* The recurrences as plain C loops: the CPU inference path of kernels/native.py (forward only, fp32).
 *
 * Why C: on a CPU each recurrence is a handful of multiply-adds and one or two exponentials per element, and every
 * eager torch formulation of it (chunked, in kernels/wkv4.py, wkv7.py, ssm.py) makes about twenty passes over the
 * data, each its own trip through memory. One loop that walks time once does the same work in one pass, as the
 * Triton kernels do on a GPU, and follows their formulas (see the Python modules' docstrings).
 *
 * Built by kernels/native.py with the system C compiler (its FLAGS say which and why). The inner loops run over
 * contiguous memory without dependences between iterations, so the compiler vectorizes them (`omp simd`, with
 * -fopenmp-simd: no OpenMP runtime); exp_clamped and softplus below are written so that they vectorize too. Each
 * function walks a range [first, last) of independent work items; kernels/native.py gives each thread a range.
 */
#include <stdint.h>
#include <string.h>

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

/* exp_clamped and softplus over an array: how tests measure their errors against float64 */
void exp_array(int64_t n, const float *x, float *out)
{
    #pragma omp simd
    for (int64_t i = 0; i < n; i++)
        out[i] = exp_clamped(x[i]);
}

void softplus_array(int64_t n, const float *x, float *out)
{
    #pragma omp simd
    for (int64_t i = 0; i < n; i++)
        out[i] = softplus(x[i]);
}

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

/* RWKV-4's WKV, the max-tracked recurrence of kernels/wkv4.py's Triton forward (same formulas, same order):
 * the scale max is kept as anchor + lag w, so that exponent differences come from key differences.
 * w, u (C,); k, v, y (B, T, C); state in and out (B, C) each: num, den, max; scratch lag (B, C), bad (B, C). A
 * work item is a batch row and a block of channels, whose time it walks; rows of C channels are contiguous, so
 * kernels/native.py makes blocks as wide as the thread count allows. A channel's outputs are NaN from its first
 * non-finite input on, as the recurrence in IEEE arithmetic would give them. */
void wkv4_forward(int64_t first, int64_t last, int64_t T, int64_t C, int64_t block,
                  const float *w, const float *u, const float *k, const float *v, float *y,
                  const float *num0, const float *den0, const float *max0,
                  float *num_out, float *den_out, float *max_out, float *lag_scratch, int32_t *bad_scratch)
{
    const int64_t blocks = (C + block - 1) / block;
    for (int64_t item = first; item < last; item++) {
        const int64_t b = item / blocks, c0 = item % blocks * block, s = b * C + c0;
        const int64_t width = C - c0 < block ? C - c0 : block;
        float *num = num_out + s, *den = den_out + s, *anchor = max_out + s, *lag = lag_scratch + s;
        int32_t *bad = bad_scratch + s;
        for (int64_t j = 0; j < width; j++) {
            num[j] = num0[s + j];
            den[j] = den0[s + j];
            anchor[j] = max0[s + j];
            lag[j] = 0.0f;
            bad[j] = nonfinite(w[c0 + j]) | nonfinite(u[c0 + j]) | nonfinite(num[j]) | nonfinite(den[j])
                     | nonfinite(anchor[j]);
        }
        for (int64_t t = 0; t < T; t++) {
            const int64_t row = (b * T + t) * C + c0;
            const float *kt = k + row, *vt = v + row;
            float *yt = y + row;
            #pragma omp simd
            for (int64_t j = 0; j < width; j++) {
                const float kj = kt[j], vj = vt[j], wj = w[c0 + j];
                bad[j] |= nonfinite(kj) | nonfinite(vj);
                /* output: the past at scale e^max against the current token e^{u + k}; the larger is 1 */
                float d = (anchor[j] - kj) + lag[j] * wj - u[c0 + j];   /* max - (u + k) */
                float x = exp_clamped(d < 0.0f ? d : -d);
                float past = d < 0.0f ? x : 1.0f, cur = d < 0.0f ? 1.0f : x;
                yt[j] = poison((past * num[j] + cur * vj) / (past * den[j] + cur), bad[j]);
                /* update: decay the past by e^w, add e^k; d = (max + w) - k decides the new scale */
                d = (anchor[j] - kj) + (lag[j] + 1.0f) * wj;
                x = exp_clamped(d < 0.0f ? d : -d);
                past = d < 0.0f ? x : 1.0f;
                cur = d < 0.0f ? 1.0f : x;
                num[j] = past * num[j] + cur * vj;
                den[j] = past * den[j] + cur;
                anchor[j] = d >= 0.0f ? anchor[j] : kj;
                lag[j] = d >= 0.0f ? lag[j] + 1.0f : 0.0f;
            }
        }
        /* max is returned rounded to fp32, and num, den follow the rounding exactly: the rounding error of
         * anchor + lag w by Knuth's two-sum (exact in IEEE arithmetic, which is why there is no -ffast-math) */
        for (int64_t j = 0; j < width; j++) {
            const float drift = lag[j] * w[c0 + j], mx = anchor[j] + drift, back = mx - anchor[j];
            const float err = (anchor[j] - (mx - back)) + (drift - back), scale = exp_clamped(err);
            num[j] = poison(num[j] * scale, bad[j]);
            den[j] = poison(den[j] * scale, bad[j]);
            anchor[j] = poison(mx, bad[j]);
        }
    }
}

/* Mamba's selective scan: delta <- softplus(delta + delta_bias) (each when asked for),
 * x_t = e^{delta_t A} x_{t-1} + delta_t B_t u_t, y_t = (C_t . x_t + D u_t) silu(z_t).
 * u, delta, z, y (batch, D, T); A (D, N); Bt, Ct (batch, T, N) (time-major: a token's N numbers adjacent);
 * delta_bias, Dskip (D,) and z may be NULL (none); state: (batch, D, N) in, overwritten with the last state.
 * A work item is a batch row and a block of LANES channels, one per vector lane, walked through time together:
 * the products over the state are then lane-wise (no sums across a vector), and B_t, C_t are read once per block.
 * A last, partial block fills its spare lanes with copies of its last channel, which compute and store exactly
 * what that channel does; the last pass (state, skip, gate) runs once per channel. Outputs are NaN from a
 * channel's first non-finite input on. */
#define LANES 8

/* LANES, for kernels/native.py's count of work items */
int64_t selective_scan_lanes(void)
{
    return LANES;
}

void selective_scan_forward(int64_t first, int64_t last, int64_t D, int64_t T, int64_t N, int64_t delta_softplus,
                            const float *u, const float *delta, const float *delta_bias, const float *A,
                            const float *Bt, const float *Ct, const float *Dskip, const float *z, float *y,
                            float *state)
{
    const int64_t blocks = (D + LANES - 1) / LANES;
    for (int64_t item = first; item < last; item++) {
        const int64_t b = item / blocks, d0 = item % blocks * LANES;
        int64_t channel[LANES];                                /* the lane's channel: spare lanes repeat the last */
        float x[N * LANES], a[N * LANES], bias[LANES], step[LANES], drive[LANES], out[LANES];   /* x, A: [n][lane] */
        int32_t bad[LANES];
        for (int64_t j = 0; j < LANES; j++) {
            channel[j] = d0 + j < D ? d0 + j : D - 1;
            bias[j] = delta_bias ? delta_bias[channel[j]] : 0.0f;
            bad[j] = nonfinite(bias[j]);
            for (int64_t n = 0; n < N; n++) {
                x[n * LANES + j] = state[(b * D + channel[j]) * N + n];
                a[n * LANES + j] = A[channel[j] * N + n];
                bad[j] |= nonfinite(x[n * LANES + j]) | nonfinite(a[n * LANES + j]);
            }
        }
        /* the steps first, along each channel's row (contiguous, so vectorized), into y: y_t is written only after
         * step t has been read */
        for (int64_t j = 0; j < LANES && d0 + j < D; j++) {
            const float *dr = delta + (b * D + channel[j]) * T;
            float *yr = y + (b * D + channel[j]) * T;
            #pragma omp simd
            for (int64_t t = 0; t < T; t++)
                yr[t] = dr[t] + bias[j];
            if (delta_softplus) {
                #pragma omp simd
                for (int64_t t = 0; t < T; t++)
                    yr[t] = softplus(yr[t]);
            }
        }
        for (int64_t t = 0; t < T; t++) {
            const float *Bn = Bt + (b * T + t) * N, *Cn = Ct + (b * T + t) * N;
            for (int64_t j = 0; j < LANES; j++) {
                const int64_t at = (b * D + channel[j]) * T + t;
                step[j] = y[at];
                drive[j] = step[j] * u[at];
                out[j] = 0.0f;
                bad[j] |= nonfinite(delta[at]) | nonfinite(u[at]);
            }
            for (int64_t n = 0; n < N; n++) {   /* B, C enter by products and sums only, which carry NaN */
                float *xn = x + n * LANES;
                const float *an = a + n * LANES, bn = Bn[n], cn = Cn[n];
                #pragma omp simd
                for (int64_t j = 0; j < LANES; j++) {
                    xn[j] = exp_clamped(step[j] * an[j]) * xn[j] + drive[j] * bn;
                    out[j] += cn * xn[j];
                }
            }
            for (int64_t j = 0; j < LANES; j++)
                y[(b * D + channel[j]) * T + t] = poison(out[j], bad[j]);
        }
        for (int64_t j = 0; j < LANES && d0 + j < D; j++) {   /* each channel once (not its spare copies) */
            for (int64_t n = 0; n < N; n++)
                state[(b * D + channel[j]) * N + n] = poison(x[n * LANES + j], bad[j]);
            /* the skip and the gate, y (C x + D u) silu(z) with silu(z) = z / (1 + e^-z), along the channel's row */
            const int64_t row = (b * D + channel[j]) * T;
            const float skip = Dskip ? Dskip[channel[j]] : 0.0f;
            float *yr = y + row;
            #pragma omp simd
            for (int64_t t = 0; t < T; t++) {
                const float gate = z ? z[row + t] / (1.0f + exp_clamped(-z[row + t])) : 1.0f;
                yr[t] = (yr[t] + skip * u[row + t]) * gate;
            }
        }
    }
}

/* RWKV-7: S_t = S_{t-1} diag(e^{log_w_t}) + (S_{t-1} a_t) b_t^T + v_t k_t^T, y_t = S_t r_t.
 * r, log_w, k, v, a, b, y (B, T, H, N); state (B, H, N, N) indexed [value, key], in, overwritten with the last
 * state; scratch (B, H, N N + N). A work item is a (batch, head) pair, whose time it walks. The loop keeps the state
 * transposed, St[key][value], so that each product is a sum of rows scaled by numbers, with a vector of independent
 * sums over the values instead of a dependent sum across each row (1.4x-1.7x faster measured, with the prefetch):
 *     sa = sum_j a_j St[j],   St[j] = e^{log_w_j} St[j] + b_j sa + k_j v,   y = sum_j r_j St[j].
 * The inputs of a head are a row of H N numbers apart from one token to the next, which the hardware prefetcher
 * does not follow, so the loop asks for them PREFETCH tokens ahead. A head's outputs are NaN from its first
 * non-finite input on. */
#define PREFETCH 2

static inline __attribute__((always_inline)) void wkv7_item(
    int64_t item, int64_t T, int64_t H, int64_t N, const float *r, const float *log_w, const float *k, const float *v,
    const float *a, const float *b, float *y, float *state, float *scratch)
{
    const int64_t bi = item / H, h = item % H;
    float *S = state + item * N * N, *St = scratch + item * (N * N + N), *w = St + N * N;   /* w: e^{log_w} */
    float sa[N], out[N];
    int32_t bad = 0;
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < N; j++) {
            St[j * N + i] = S[i * N + j];
            bad |= nonfinite(S[i * N + j]);
        }
    for (int64_t t = 0; t < T; t++) {
        const int64_t off = ((bi * T + t) * H + h) * N;
        const float *rt = r + off, *kt = k + off, *vt = v + off, *at = a + off, *bt = b + off;
        if (t + PREFETCH < T)
            for (int64_t j = 0; j < N; j += 16) {                      /* 16 floats: a cache line */
                const int64_t ahead = off + PREFETCH * H * N + j;
                __builtin_prefetch(r + ahead);
                __builtin_prefetch(log_w + ahead);
                __builtin_prefetch(k + ahead);
                __builtin_prefetch(v + ahead);
                __builtin_prefetch(a + ahead);
                __builtin_prefetch(b + ahead);
            }
        #pragma omp simd reduction(|:bad)
        for (int64_t j = 0; j < N; j++) {
            w[j] = exp_clamped(log_w[off + j]);
            bad |= nonfinite(rt[j]) | nonfinite(log_w[off + j]) | nonfinite(kt[j]) | nonfinite(vt[j])
                   | nonfinite(at[j]) | nonfinite(bt[j]);
        }
        for (int64_t i = 0; i < N; i++) {
            sa[i] = 0.0f;
            out[i] = 0.0f;
        }
        for (int64_t j = 0; j < N; j++) {                              /* sa = S_{t-1} a_t */
            const float aj = at[j], *row = St + j * N;
            #pragma omp simd
            for (int64_t i = 0; i < N; i++)
                sa[i] += aj * row[i];
        }
        for (int64_t j = 0; j < N; j++) {                              /* S_t, and y_t = S_t r_t */
            const float wj = w[j], bj = bt[j], kj = kt[j], rj = rt[j];
            float *row = St + j * N;
            #pragma omp simd
            for (int64_t i = 0; i < N; i++) {
                row[i] = wj * row[i] + bj * sa[i] + kj * vt[i];
                out[i] += rj * row[i];
            }
        }
        for (int64_t i = 0; i < N; i++)
            y[off + i] = poison(out[i], bad);
    }
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < N; j++)
            S[i * N + j] = poison(St[j * N + i], bad);
}

void wkv7_forward(int64_t first, int64_t last, int64_t T, int64_t H, int64_t N,
                  const float *r, const float *log_w, const float *k, const float *v, const float *a,
                  const float *b, float *y, float *state, float *scratch)
{
    for (int64_t item = first; item < last; item++) {
        if (N == 64)   /* RWKV-7's head size: with N a constant the compiler unrolls the rows (1.35x measured) */
            wkv7_item(item, T, H, 64, r, log_w, k, v, a, b, y, state, scratch);
        else
            wkv7_item(item, T, H, N, r, log_w, k, v, a, b, y, state, scratch);
    }
}
