/* The recurrences as plain C loops: the CPU path of kernels/native.py (forward and backward, fp32).
 *
 * Why C: on a CPU each recurrence is a handful of multiply-adds and one or two exponentials per element, and every
 * eager torch formulation of it (chunked, in kernels/wkv4.py, wkv7.py, ssm.py) makes about twenty passes over the
 * data, each its own trip through memory. One loop that walks time once does the same work in one pass, as the
 * Triton kernels do on a GPU, and follows their formulas (see the Python modules' docstrings). The backwards walk
 * time in reverse as the Triton backwards do: WKV-4 from what its forward saved per token, WKV-7 and the scan from
 * states their forwards saved every few steps (re-running those steps forward, then walking them back).
 *
 * Built by kernels/native.py with the system C compiler (its FLAGS say which and why). The inner loops run over
 * contiguous memory without dependences between iterations, so the compiler vectorizes them (`omp simd`; these loops
 * start no OpenMP threads); exp_clamped and softplus (native.h) are written so that they vectorize too. Each
 * function walks a range [first, last) of independent work items; kernels/native.py gives each thread a range.
 * Every work item writes outputs of its own (no two items add into one number), and sums over work items run
 * afterwards in a fixed order (sum_rows): results do not depend on the number of threads or their timing.
 * Every entry point returns a status (native.h's enum status: out of memory, a head size the loops do not take),
 * which kernels/native.py turns into an error.
 */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native.h"

/* exp_clamped and softplus over an array: how tests measure their errors against float64 */
int exp_array(int64_t n, const float *x, float *out)
{
    #pragma omp simd
    for (int64_t i = 0; i < n; i++)
        out[i] = exp_clamped(x[i]);
    return STATUS_OK;
}

int softplus_array(int64_t n, const float *x, float *out)
{
    #pragma omp simd
    for (int64_t i = 0; i < n; i++)
        out[i] = softplus(x[i]);
    return STATUS_OK;
}

/* out[i] = sum_r in[r cols + i], the rows added in the order r = 0, 1, ... whatever the split: the sums over batch
 * rows (or groups of channels) of the parameter gradients. Work items: columns. */
int sum_rows(int64_t first, int64_t last, int64_t rows, int64_t cols, const float *in, float *out)
{
    #pragma omp simd
    for (int64_t i = first; i < last; i++)
        out[i] = in[i];
    for (int64_t r = 1; r < rows; r++) {
        const float *row = in + r * cols;
        #pragma omp simd
        for (int64_t i = first; i < last; i++)
            out[i] += row[i];
    }
    return STATUS_OK;
}

/* A buffer of n floats for one call's work items (freed by the caller), 64-byte aligned; NULL when out of memory
 * (the entry point then returns STATUS_NO_MEMORY). */
static float *scratch_floats(int64_t n)
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

/* ------------------------------------------------------------------------------------------------------ WKV-4 */

/* RWKV-4's WKV, the max-tracked recurrence of kernels/wkv4.py's Triton forward (same formulas, same order):
 * the scale max is kept as anchor + lag w, so that exponent differences come from key differences.
 * w, u (C,); k, v, y (B, T, C); state in and out (B, C) each: num, den, max; lag, bad (B, C): the steps since the
 * final max's term and whether the channel met a non-finite input (the backward reads both). With SAVE, also per
 * token what the backward needs, as the Triton forward saves it: vy = v - y (without cancellation), d = max - (u + k),
 * z = the output's denominator over e^{the larger of max, u + k}; (B, T, C) each. A work item is a batch row and a
 * block of channels, whose time it walks; rows of C channels are contiguous, so kernels/native.py makes blocks as wide
 * as the thread count allows. A channel's outputs are NaN from its first NaN or +inf input on, as the recurrence in
 * IEEE arithmetic would give them (-inf in k, u or the state's max is a weight of 0, see nan_or_plus_inf). */
static inline __attribute__((always_inline)) void wkv4_item(
    int64_t item, int64_t T, int64_t C, int64_t block, const int save,
    const float *w, const float *u, const float *k, const float *v, float *y,
    const float *num0, const float *den0, const float *max0, float *num_out, float *den_out, float *max_out,
    float *lag_out, int32_t *bad_out, float *vy_save, float *d_save, float *z_save)
{
    const int64_t blocks = (C + block - 1) / block;
    const int64_t b = item / blocks, c0 = item % blocks * block, s = b * C + c0;
    const int64_t width = C - c0 < block ? C - c0 : block;
    float *num = num_out + s, *den = den_out + s, *anchor = max_out + s, *lag = lag_out + s;
    int32_t *bad = bad_out + s;
    for (int64_t j = 0; j < width; j++) {
        num[j] = num0[s + j];
        den[j] = den0[s + j];
        anchor[j] = max0[s + j];
        lag[j] = 0.0f;
        bad[j] = nonfinite(w[c0 + j]) | nan_or_plus_inf(u[c0 + j]) | nonfinite(num[j]) | nonfinite(den[j])
                 | nan_or_plus_inf(anchor[j]);
    }
    for (int64_t t = 0; t < T; t++) {
        const int64_t row = (b * T + t) * C + c0;
        const float *kt = k + row, *vt = v + row;
        float *yt = y + row;
        #pragma omp simd
        for (int64_t j = 0; j < width; j++) {
            const float kj = kt[j], vj = vt[j], wj = w[c0 + j];
            bad[j] |= nan_or_plus_inf(kj) | nonfinite(vj);
            /* output: the past at scale e^max against the current token e^{u + k}; the larger is 1 */
            float d = (anchor[j] - kj) + lag[j] * wj - u[c0 + j];   /* max - (u + k) */
            float x = exp_clamped(d < 0.0f ? d : -d);
            float past = d < 0.0f ? x : 1.0f, cur = d < 0.0f ? 1.0f : x;
            const float z = past * den[j] + cur;
            yt[j] = poison((past * num[j] + cur * vj) / z, bad[j]);
            if (save) {
                vy_save[row + j] = past * (den[j] * vj - num[j]) / z;
                d_save[row + j] = d;
                z_save[row + j] = z;
            }
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

int wkv4_forward(int64_t first, int64_t last, int64_t T, int64_t C, int64_t block,
                 const float *w, const float *u, const float *k, const float *v, float *y,
                 const float *num0, const float *den0, const float *max0, float *num_out, float *den_out,
                 float *max_out, float *lag_out, int32_t *bad_out, float *vy_save, float *d_save, float *z_save)
{
    for (int64_t item = first; item < last; item++) {
        if (vy_save)
            wkv4_item(item, T, C, block, 1, w, u, k, v, y, num0, den0, max0, num_out, den_out, max_out, lag_out,
                      bad_out, vy_save, d_save, z_save);
        else
            wkv4_item(item, T, C, block, 0, w, u, k, v, y, num0, den0, max0, num_out, den_out, max_out, lag_out,
                      bad_out, NULL, NULL, NULL);
    }
    return STATUS_OK;
}

/* The backward of wkv4_forward, kernels/wkv4.py's Triton backward (same formulas, same names): time in reverse with
 * the adjoints of the represented sums N^, D^ (an, ad) and of their w-derivatives (bn, bd), kept multiplied by
 * e^{max_t}, every factor one of the forward's exponentials rebuilt from the saved d_t and z_t:
 *     A(t) = gy_t / Z_t (and -gy_t y_t / Z_t) + e^w A(t+1),   B(t) = e^w (B(t+1) + A(t+1)).
 * gy (B, T, C); gnum, gden, gmax (B, C): the cotangents of y and of the final state; num, den (B, C) the final state.
 * Out: gk, gv (B, T, C); gw, gu (B, C), each batch row's share (kernels/native.py sums them); gnum0, gden0, gmax0
 * (B, C). A channel that met a non-finite input has NaN gradients. Work items as in wkv4_forward. */
int wkv4_backward(int64_t first, int64_t last, int64_t T, int64_t C, int64_t block,
                   const float *w, const float *u, const float *k, const float *v,
                   const float *vy_save, const float *d_save, const float *z_save, const float *gy,
                   const float *num0, const float *den0, const float *max0, const float *num, const float *den,
                   const float *lag_in, const int32_t *bad, const float *gnum, const float *gden, const float *gmax,
                   float *gk, float *gv, float *gw_out, float *gu_out, float *gnum0, float *gden0, float *gmax0)
{
    const int64_t blocks = (C + block - 1) / block;
    float *buffer = scratch_floats(7 * block);
    if (!buffer)
        return STATUS_NO_MEMORY;
    float *an = buffer, *ad = an + block, *bn = ad + block, *bd = bn + block, *gw = bd + block, *gu = gw + block;
    float *top = gu + block;                              /* g_top: the final max's effective gradient */
    for (int64_t item = first; item < last; item++) {
        const int64_t b = item / blocks, c0 = item % blocks * block, s = b * C + c0;
        const int64_t width = C - c0 < block ? C - c0 : block;
        const float *lag = lag_in + s;
        for (int64_t j = 0; j < width; j++) {
            const float wj = w[c0 + j];
            /* the final max's own gradient, less what the returned num, den (divided by e^max) pass to it */
            top[j] = gmax[s + j] - gnum[s + j] * num[s + j] - gden[s + j] * den[s + j];
            /* the final max's term: token T-1-lag, or the initial state's when lag = T; redo the forward's rounding
             * of it, since the returned num, den were scaled by e^err */
            const float anchor = lag[j] < (float)T ? k[(b * T + T - 1 - (int64_t)lag[j]) * C + c0 + j] : max0[s + j];
            const float drift = lag[j] * wj, mx = anchor + drift, back = mx - anchor;
            const float scale = exp_clamped((anchor - (mx - back)) + (drift - back));
            an[j] = gnum[s + j] * scale;
            ad[j] = gden[s + j] * scale;
            bn[j] = bd[j] = gw[j] = gu[j] = 0.0f;
        }
        for (int64_t i = 0; i < T; i++) {
            const int64_t t = T - 1 - i, row = (b * T + t) * C + c0;
            #pragma omp simd
            for (int64_t j = 0; j < width; j++) {
                const float vj = v[row + j], gyj = gy[row + j], vy = vy_save[row + j], d = d_save[row + j];
                const float z = z_save[row + j];
                const float d_next = d + (u[c0 + j] + w[c0 + j]);       /* (max_t + w) - k_t */
                float x = exp_clamped(d_next < 0.0f ? d_next : -d_next);
                const float into_next = d_next < 0.0f ? 1.0f : x;       /* e^{k_t - max_{t+1}} */
                const float decay = d_next < 0.0f ? x : 1.0f;           /* e^{max_t + w - max_{t+1}} */
                x = exp_clamped(d < 0.0f ? d : -d);
                const float past = (d < 0.0f ? x : 1.0f) / z;           /* e^{max_t} / Z_t */
                const float cur = gyj * (d < 0.0f ? 1.0f : x) / z;      /* gy_t e^{u + k_t} / Z_t */
                const float g_bonus = cur * vy;                         /* dL/d(u + k_t) through y_t */
                gv[row + j] = poison(into_next * an[j] + cur, bad[s + j]);
                gk[row + j] = poison(into_next * (an[j] * vj + ad[j]) + g_bonus
                                     + (lag[j] == (float)(T - 1 - t) ? top[j] : 0.0f), bad[s + j]);
                gu[j] += g_bonus;
                gw[j] += into_next * (bn[j] * vj + bd[j]);
                /* A(t) = gy_t / Z_t (and -gy_t y_t / Z_t) + e^w A(t+1);  B(t) = e^w (B(t+1) + A(t+1)) */
                bn[j] = decay * (bn[j] + an[j]);
                bd[j] = decay * (bd[j] + ad[j]);
                an[j] = decay * an[j] + past * gyj;
                ad[j] = decay * ad[j] - past * gyj * (vj - vy);
            }
        }
        for (int64_t j = 0; j < width; j++) {
            const int32_t poisoned = bad[s + j];
            const int32_t from_token = lag[j] < (float)T;
            /* the initial state's decay, then d max_T / dw */
            gw_out[s + j] = poison(gw[j] + bn[j] * num0[s + j] + bd[j] * den0[s + j] + lag[j] * top[j], poisoned);
            gu_out[s + j] = poison(gu[j], poisoned);
            gnum0[s + j] = poison(an[j], poisoned);
            gden0[s + j] = poison(ad[j], poisoned);
            gmax0[s + j] = poison(an[j] * num0[s + j] + ad[j] * den0[s + j] + (from_token ? 0.0f : top[j]), poisoned);
        }
    }
    free(buffer);
    return STATUS_OK;
}

/* --------------------------------------------------------------------------------------------- selective scan */

/* Mamba's selective scan: delta <- softplus(delta + delta_bias) (each when asked for),
 * x_t = e^{delta_t A} x_{t-1} + delta_t B_t u_t, y_t = (C_t . x_t + D u_t) silu(z_t).
 * u, delta, z, y (batch, D, T); A (D, N); Bt, Ct (batch, T, N) (time-major: a token's N numbers adjacent);
 * delta_bias, Dskip (D,) and z may be NULL (none); state: (batch, D, N) in, overwritten with the last state.
 * A work item is a batch row and a block of LANES channels, one per vector lane, walked through time together:
 * the products over the state are then lane-wise (no sums across a vector), and B_t, C_t are read once per block.
 * A last, partial block fills its spare lanes with copies of its last channel, which compute and store exactly
 * what that channel does; the last pass (state, skip, gate) runs once per channel. Outputs are NaN from a
 * channel's first non-finite input on. For the backward (ckpt not NULL): the state before every ck-th token,
 * ckpt (batch * blocks, ceil(T / ck), N, LANES) in the loop's lane layout, and bad (batch * blocks, LANES): whether
 * each lane met a non-finite input. */
#define LANES 8

/* LANES, for kernels/native.py's count of work items */
int64_t selective_scan_lanes(void)
{
    return LANES;
}

/* A block's lanes: channel (spare lanes repeat the last), delta's bias, A as [n][lane], and which lanes start bad. */
static void scan_lanes(int64_t d0, int64_t D, int64_t N, const float *delta_bias, const float *A, int64_t *channel,
                       float *bias, float *a, int32_t *bad)
{
    for (int64_t j = 0; j < LANES; j++) {
        channel[j] = d0 + j < D ? d0 + j : D - 1;
        bias[j] = delta_bias ? delta_bias[channel[j]] : 0.0f;
        bad[j] = nonfinite(bias[j]);
        for (int64_t n = 0; n < N; n++) {   /* A = -inf, a decay of 0, as the most negative finite number (as the
                                               other backends take it: kernels/ssm.py hands A over as it came) */
            const float An = A[channel[j] * N + n];
            a[n * LANES + j] = is_minus_inf(An) ? -FLT_MAX : An;     /* a bit test: the loops assume finite math */
            bad[j] |= nan_or_plus_inf(An);
        }
    }
}

/* The steps delta_t (+ bias, softplus) along each real channel's row of T, into out (contiguous, so vectorized). */
static void scan_steps(int64_t d0, int64_t D, int64_t T, int64_t row0, int64_t delta_softplus, const float *delta,
                       const float *bias, float *out)
{
    for (int64_t j = 0; j < LANES && d0 + j < D; j++) {
        const float *dr = delta + row0 + j * T;
        float *o = out + row0 + j * T;
        #pragma omp simd
        for (int64_t t = 0; t < T; t++)
            o[t] = dr[t] + bias[j];
        if (delta_softplus) {
            #pragma omp simd
            for (int64_t t = 0; t < T; t++)
                o[t] = softplus(o[t]);
        }
    }
}

int selective_scan_forward(int64_t first, int64_t last, int64_t D, int64_t T, int64_t N, int64_t delta_softplus,
                           const float *u, const float *delta, const float *delta_bias, const float *A,
                           const float *Bt, const float *Ct, const float *Dskip, const float *z, float *y,
                           float *state, int64_t ck, float *ckpt, int32_t *bad_out)
{
    const int64_t blocks = (D + LANES - 1) / LANES, n_ckpt = (T + ck - 1) / ck;
    for (int64_t item = first; item < last; item++) {
        const int64_t b = item / blocks, d0 = item % blocks * LANES;
        int64_t channel[LANES];                                /* the lane's channel: spare lanes repeat the last */
        float x[N * LANES], a[N * LANES], bias[LANES], step[LANES], drive[LANES], out[LANES];   /* x, A: [n][lane] */
        int32_t bad[LANES];
        scan_lanes(d0, D, N, delta_bias, A, channel, bias, a, bad);
        for (int64_t j = 0; j < LANES; j++)
            for (int64_t n = 0; n < N; n++) {
                x[n * LANES + j] = state[(b * D + channel[j]) * N + n];
                bad[j] |= nonfinite(x[n * LANES + j]);
            }
        /* the steps first, into y: y_t is written only after step t has been read */
        scan_steps(d0, D, T, (b * D + d0) * T, delta_softplus, delta, bias, y);
        for (int64_t t = 0; t < T; t++) {
            const float *Bn = Bt + (b * T + t) * N, *Cn = Ct + (b * T + t) * N;
            if (ckpt && t % ck == 0)
                memcpy(ckpt + (item * n_ckpt + t / ck) * N * LANES, x, sizeof x);
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
        if (bad_out)
            memcpy(bad_out + item * LANES, bad, sizeof bad);
        for (int64_t j = 0; j < LANES && d0 + j < D; j++) {   /* each channel once (not its spare copies) */
            for (int64_t n = 0; n < N; n++)
                state[(b * D + channel[j]) * N + n] = poison(x[n * LANES + j], bad[j]);
            /* the skip and the gate, y (C x + D u) silu(z) with silu(z) = z / (1 + e^-z), along the channel's row */
            const int64_t row = (b * D + channel[j]) * T;
            const float skip = Dskip ? Dskip[channel[j]] : 0.0f;
            float *yr = y + row;
            #pragma omp simd
            for (int64_t t = 0; t < T; t++) {
                /* silu(-inf) = -inf e^-inf: NaN, as in IEEE arithmetic (e^-z is clamped here) */
                const float gate = z ? silu(z[row + t]) : 1.0f;
                yr[t] = (yr[t] + skip * u[row + t]) * gate;
            }
        }
    }
    return STATUS_OK;
}

/* The backward of selective_scan_forward, the formulas of kernels/ssm.py's Triton backward plus the elementwise
 * ends of the op. For each chunk of ck tokens from the last: re-run it forward from its checkpoint, keeping every
 * x_t and alpha_t = e^{delta_t A}, then walk it back with nu = dL/dx_t through the later tokens:
 *     pre_t = C_t . x_t + D u_t,   y_t = pre_t silu(z_t):  dpre = dy silu(z),  dz = dy pre silu'(z),  dD += dpre u
 *     lambda_t = nu + dpre C_t (dL/dx_t),   dC_t += dpre x_t,   dB_t += lambda_t delta_t u_t,
 *     dL/d(delta_t A) = lambda_t alpha_t x_{t-1}:  ddelta_t = sum_n (that) A + u_t sum_n lambda_t B_t,
 *                                                  dA += (that) delta_t,
 *     du_t = delta_t sum_n lambda_t B_t + dpre D,   nu <- alpha_t lambda_t;   softplus: ddelta *= sigmoid(raw delta)
 * A work item is a batch row and a group of `per_group` blocks of LANES channels (a number of groups per batch row
 * chosen from the shapes alone); it walks the chunks from the last, each through every block of the group, whose
 * nu and sums it keeps meanwhile. dB and dC are sums over channels: the lanes' shares are added lane by lane over
 * the group's blocks, then across the lanes once per chunk, into dB_part, dC_part (batch * groups, T, N); kernels/
 * native.py sums the groups. dA_part (batch, D, N), dD_part, dbias_part (batch, D): each batch row's share. A chunk's
 * rows of u, dy, z, delta (and the outputs du, ddelta, dz) pass through [token][lane] tiles, so that the per-token
 * work over a block's lanes is a vector too. Spare lanes see dy = 0 and a zero dlast, so they add exact zeros. A
 * lane that met a non-finite input has NaN gradients, and so have dB, dC of its batch row's group. */
/* The backward's helpers below are always inlined, so that the loops compile as they did in one function. */

/* A group's start: nu = dlast for its real lanes, zero for the spare ones (so they add exact zeros); its sums dA,
 * dD, dbias zeroed. Returns whether any of the group's lanes met a non-finite input in the forward. */
static inline __attribute__((always_inline)) int32_t scan_group_start(
    int64_t b, int64_t blk0, int64_t n_blk, int64_t blocks, int64_t D, int64_t N, const int32_t *bad_in,
    const float *dlast, float *nus, float *dAs, float *dDs, float *dbiases)
{
    const int64_t state = N * LANES;
    int32_t group_bad = 0;
    for (int64_t bk = 0; bk < n_blk; bk++)
        for (int64_t j = 0; j < LANES && (blk0 + bk) * LANES + j < D; j++) {
            const int64_t d = (blk0 + bk) * LANES + j;
            group_bad |= bad_in[(b * blocks + blk0 + bk) * LANES + j];
            for (int64_t n = 0; n < N; n++)
                nus[bk * state + n * LANES + j] = dlast[(b * D + d) * N + n];
        }
    for (int64_t bk = 0; bk < n_blk; bk++)       /* spare lanes: zero nu, so zero everything */
        for (int64_t j = 0; j < LANES; j++) {
            if ((blk0 + bk) * LANES + j >= D)
                for (int64_t n = 0; n < N; n++)
                    nus[bk * state + n * LANES + j] = 0.0f;
            dDs[bk * LANES + j] = dbiases[bk * LANES + j] = 0.0f;
            for (int64_t n = 0; n < N; n++)
                dAs[bk * state + n * LANES + j] = 0.0f;
        }
    return group_bad;
}

/* A block's rows of chunk c (tokens t0 .. t0 + L - 1) as [token][lane] tiles: the steps delta + bias (softplus'd
 * when asked, with softplus's slope, else a slope of 1), u, dy (zero in spare lanes) and z (zero without); per lane
 * the skip D and whether it met a non-finite input (bad_block: the forward's flags of this block). Asks for the
 * previous chunk's rows meanwhile, which this block reads next. */
static inline __attribute__((always_inline)) void scan_chunk_tiles(
    int64_t b, int64_t d0, int64_t D, int64_t T, int64_t c, int64_t ck, int64_t L, int64_t delta_softplus,
    const int64_t *channel, const float *bias, const float *u, const float *delta, const float *Dskip,
    const float *z, const float *dy, const int32_t *bad_block, float *skip, int32_t *bad, float *step,
    float *slope, float *ut, float *gt, float *zt)
{
    const int64_t t0 = c * ck;
    for (int64_t j = 0; j < LANES; j++) {
        const int64_t row = (b * D + channel[j]) * T + t0;
        const float live = d0 + j < D ? 1.0f : 0.0f;
        skip[j] = Dskip ? Dskip[channel[j]] : 0.0f;
        bad[j] = bad_block[j];
        if (c > 0) {             /* the previous chunk's rows, which this block reads next time */
            __builtin_prefetch(delta + row - ck);
            __builtin_prefetch(u + row - ck);
            __builtin_prefetch(dy + row - ck);
            if (z)
                __builtin_prefetch(z + row - ck);
        }
        for (int64_t l = 0; l < L; l++) {                 /* the chunk's rows, as [token][lane] tiles */
            step[l * LANES + j] = delta[row + l] + bias[j];
            ut[l * LANES + j] = u[row + l];
            gt[l * LANES + j] = live * dy[row + l];
            zt[l * LANES + j] = z ? z[row + l] : 0.0f;
        }
    }
    if (delta_softplus) {
        #pragma omp simd
        for (int64_t i = 0; i < L * LANES; i++) {     /* softplus and its slope, sigmoid */
            slope[i] = sigmoid(step[i]);
            step[i] = softplus(step[i]);
        }
    } else {
        for (int64_t i = 0; i < L * LANES; i++)
            slope[i] = 1.0f;
    }
}

/* The chunk forward again from its checkpoint x0 (N x LANES): xs[l + 1] = x_t and alphas[l] = alpha_t for its
 * tokens t0 + l, l < L (xs[0] = x0). */
static inline __attribute__((always_inline)) void scan_chunk_forward(
    int64_t b, int64_t T, int64_t N, int64_t t0, int64_t L, const float *x0, const float *Bt, const float *a,
    const float *step, const float *ut, float *xs, float *alphas)
{
    memcpy(xs, x0, N * LANES * sizeof(float));
    for (int64_t l = 0; l < L; l++) {
        const float *Bn = Bt + (b * T + t0 + l) * N, *sl = step + l * LANES, *ul = ut + l * LANES;
        for (int64_t n = 0; n < N; n++) {
            const float *xp = xs + (l * N + n) * LANES, *an = a + n * LANES, bn = Bn[n];
            float *xn = xs + ((l + 1) * N + n) * LANES, *al = alphas + (l * N + n) * LANES;
            #pragma omp simd
            for (int64_t j = 0; j < LANES; j++) {
                /* exactly 0 below the clamp (A = -inf, a decay of 0, or delta A < -87): e^-87 would
                 * meet A again in gA = ga A, up to FLT_MAX, an O(1) term of d/ddelta. Written as a product by
                 * 0 or 1, not as `e < -87 ? 0 : exp_clamped(e)`: GCC 12 does not if-convert that select around
                 * the inlined exponential, and this loop ran scalar (the scan's training 2x slower, issue 42) */
                const float e = sl[j] * an[j], keep = e < -87.0f ? 0.0f : 1.0f;
                al[j] = keep * exp_clamped(e);
                xn[j] = al[j] * xp[j] + sl[j] * ul[j] * bn;
            }
        }
    }
}

/* The chunk walked back, token t0 + L - 1 to t0, for one block: the formulas above, from the tiles, the re-run
 * xs and alphas, and the block's nu (carried in and out) and sums dA, dD, dbias (added to); the lanes' shares of
 * dB_t, dC_t are added into shareB, shareC, and du, ddelta, dz go to the tiles du_t, dd_t, dz_t. z: the op's
 * (NULL: no gate). */
static inline __attribute__((always_inline)) void scan_chunk_backward(
    int64_t b, int64_t T, int64_t N, int64_t t0, int64_t L, const float *Bt, const float *Ct, const float *z,
    const float *a, const float *skip, const float *xs, const float *alphas, const float *step, const float *slope,
    const float *ut, const float *gt, const float *zt, float *nu, float *dA, float *dDacc, float *dbias,
    float *shareB, float *shareC, float *du_t, float *dd_t, float *dz_t)
{
    const int64_t state = N * LANES;
    float pre[LANES], dpre[LANES], lamB[LANES], gA[LANES];
    for (int64_t l = L - 1; l >= 0; l--) {
        const int64_t t = t0 + l;
        const float *Bn = Bt + (b * T + t) * N, *Cn = Ct + (b * T + t) * N, *xt = xs + (l + 1) * state;
        const float *sl = step + l * LANES, *ul = ut + l * LANES, *gl = gt + l * LANES;
        const float *zl = zt + l * LANES;
        #pragma omp simd
        for (int64_t j = 0; j < LANES; j++)
            pre[j] = skip[j] * ul[j];
        for (int64_t n = 0; n < N; n++)                                  /* + C_t . x_t */
            #pragma omp simd
            for (int64_t j = 0; j < LANES; j++)
                pre[j] += Cn[n] * xt[n * LANES + j];
        #pragma omp simd
        for (int64_t j = 0; j < LANES; j++) {
            /* silu(z) = z sigmoid(z), silu'(z) = sigmoid(z) (1 + z (1 - sigmoid(z))) */
            const float sg = sigmoid(zl[j]);
            dpre[j] = z ? gl[j] * zl[j] * sg : gl[j];
            dz_t[l * LANES + j] = gl[j] * pre[j] * sg * (1.0f + zl[j] * (1.0f - sg));
            dDacc[j] += dpre[j] * ul[j];
            lamB[j] = gA[j] = 0.0f;
        }
        for (int64_t n = 0; n < N; n++) {
            const float *xp = xs + (l * N + n) * LANES, *xn = xt + n * LANES;
            const float *al = alphas + (l * N + n) * LANES, *an = a + n * LANES, bn = Bn[n], cn = Cn[n];
            float *nun = nu + n * LANES, *dAn = dA + n * LANES;
            float *sB = shareB + (l * N + n) * LANES, *sC = shareC + (l * N + n) * LANES;
            #pragma omp simd
            for (int64_t j = 0; j < LANES; j++) {
                const float lam = nun[j] + dpre[j] * cn;                  /* dL/dx_t */
                const float ga = lam * al[j] * xp[j];                     /* dL/d(delta_t A) */
                sC[j] += dpre[j] * xn[j];
                sB[j] += lam * sl[j] * ul[j];
                lamB[j] += lam * bn;
                dAn[j] += ga * sl[j];
                gA[j] += ga * an[j];
                nun[j] = al[j] * lam;
            }
        }
        #pragma omp simd
        for (int64_t j = 0; j < LANES; j++) {
            const float dd = (gA[j] + lamB[j] * ul[j]) * slope[l * LANES + j];
            dbias[j] += dd;
            du_t[l * LANES + j] = lamB[j] * sl[j] + dpre[j] * skip[j];
            dd_t[l * LANES + j] = dd;
        }
    }
}

/* The tiles du_t, dd_t, dz_t of a block's chunk back into the rows of du, ddelta, dz (dz only with a gate z), each
 * real lane's (NaN where it met a non-finite input). */
static inline __attribute__((always_inline)) void scan_store_tiles(
    int64_t b, int64_t d0, int64_t D, int64_t T, int64_t t0, int64_t L, const int64_t *channel, const int32_t *bad,
    const float *z, const float *du_t, const float *dd_t, const float *dz_t, float *du, float *ddelta, float *dz)
{
    for (int64_t j = 0; j < LANES && d0 + j < D; j++) {
        const int64_t row = (b * D + channel[j]) * T + t0;
        for (int64_t l = 0; l < L; l++) {
            du[row + l] = poison(du_t[l * LANES + j], bad[j]);
            ddelta[row + l] = poison(dd_t[l * LANES + j], bad[j]);
            if (z)
                dz[row + l] = poison(dz_t[l * LANES + j], bad[j]);
        }
    }
}

/* A group's end: its blocks' nu (dL/dx_0, the initial state's gradient), dA, dD and dbias, each real lane's, into
 * the batch row's outputs (NaN for a lane that met a non-finite input). */
static inline __attribute__((always_inline)) void scan_group_store(
    int64_t b, int64_t blk0, int64_t n_blk, int64_t blocks, int64_t D, int64_t N, const int32_t *bad_in,
    const float *nus, const float *dAs, const float *dDs, const float *dbiases, float *dstate, float *dA_part,
    float *dD_part, float *dbias_part)
{
    const int64_t state = N * LANES;
    for (int64_t bk = 0; bk < n_blk; bk++)
        for (int64_t j = 0; j < LANES && (blk0 + bk) * LANES + j < D; j++) {
            const int64_t d = (blk0 + bk) * LANES + j, at = b * D + d;
            const int32_t poisoned = bad_in[(b * blocks + blk0 + bk) * LANES + j];
            for (int64_t n = 0; n < N; n++) {
                dstate[at * N + n] = poison(nus[bk * state + n * LANES + j], poisoned);
                dA_part[at * N + n] = poison(dAs[bk * state + n * LANES + j], poisoned);
            }
            dD_part[at] = poison(dDs[bk * LANES + j], poisoned);
            dbias_part[at] = poison(dbiases[bk * LANES + j], poisoned);
        }
}

int selective_scan_backward(int64_t first, int64_t last, int64_t D, int64_t T, int64_t N, int64_t delta_softplus,
                            int64_t per_group, const float *u, const float *delta, const float *delta_bias,
                            const float *A, const float *Bt, const float *Ct, const float *Dskip, const float *z,
                            int64_t ck, const float *ckpt, const int32_t *bad_in, const float *dy,
                            const float *dlast, float *du, float *ddelta, float *dz, float *dA_part,
                            float *dB_part, float *dC_part, float *dD_part, float *dbias_part, float *dstate)
{
    const int64_t blocks = (D + LANES - 1) / LANES, groups = (blocks + per_group - 1) / per_group;
    const int64_t n_ckpt = (T + ck - 1) / ck, tile = ck * LANES, state = N * LANES;
    /* per call: the chunk's x_t (ck + 1 of them), alpha_t, the lanes' shares of dB and dC; eight [token][lane]
     * tiles; per block of a group: nu, dA (N x LANES), dD, dbias (LANES) */
    float *xs = scratch_floats((ck + 1) * state + 3 * ck * state + 8 * tile + per_group * (2 * state + 2 * LANES));
    if (!xs)
        return STATUS_NO_MEMORY;
    float *alphas = xs + (ck + 1) * state, *shareB = alphas + ck * state, *shareC = shareB + ck * state;
    float *step = shareC + ck * state, *slope = step + tile, *ut = slope + tile, *gt = ut + tile, *zt = gt + tile;
    float *du_t = zt + tile, *dd_t = du_t + tile, *dz_t = dd_t + tile;
    float *nus = dz_t + tile, *dAs = nus + per_group * state, *dDs = dAs + per_group * state;
    float *dbiases = dDs + per_group * LANES;
    for (int64_t item = first; item < last; item++) {
        const int64_t b = item / groups, g = item % groups, blk0 = g * per_group;
        const int64_t n_blk = blocks - blk0 < per_group ? blocks - blk0 : per_group;
        const int32_t group_bad = scan_group_start(b, blk0, n_blk, blocks, D, N, bad_in, dlast, nus, dAs, dDs,
                                                   dbiases);
        for (int64_t c = n_ckpt - 1; c >= 0; c--) {
            const int64_t t0 = c * ck, L = T - t0 < ck ? T - t0 : ck;
            memset(shareB, 0, 2 * ck * state * sizeof(float));
            for (int64_t bk = 0; bk < n_blk; bk++) {
                const int64_t blk = blk0 + bk, d0 = blk * LANES, fwd_item = b * blocks + blk;
                int64_t channel[LANES];
                float a[N * LANES], bias[LANES], skip[LANES];
                int32_t bad[LANES];
                scan_lanes(d0, D, N, delta_bias, A, channel, bias, a, bad);
                scan_chunk_tiles(b, d0, D, T, c, ck, L, delta_softplus, channel, bias, u, delta, Dskip, z, dy,
                                 bad_in + fwd_item * LANES, skip, bad, step, slope, ut, gt, zt);
                scan_chunk_forward(b, T, N, t0, L, ckpt + (fwd_item * n_ckpt + c) * state, Bt, a, step, ut, xs,
                                   alphas);
                scan_chunk_backward(b, T, N, t0, L, Bt, Ct, z, a, skip, xs, alphas, step, slope, ut, gt, zt,
                                    nus + bk * state, dAs + bk * state, dDs + bk * LANES, dbiases + bk * LANES,
                                    shareB, shareC, du_t, dd_t, dz_t);
                scan_store_tiles(b, d0, D, T, t0, L, channel, bad, z, du_t, dd_t, dz_t, du, ddelta, dz);
            }
            for (int64_t l = 0; l < L; l++)            /* dB_t, dC_t: the lanes' shares added across the lanes */
                for (int64_t n = 0; n < N; n++) {
                    const int64_t at = (item * T + t0 + l) * N + n;
                    dB_part[at] = poison(sum8(shareB + (l * N + n) * LANES), group_bad);
                    dC_part[at] = poison(sum8(shareC + (l * N + n) * LANES), group_bad);
                }
        }
        scan_group_store(b, blk0, n_blk, blocks, D, N, bad_in, nus, dAs, dDs, dbiases, dstate, dA_part, dD_part,
                         dbias_part);
    }
    free(xs);
    return STATUS_OK;
}

/* ------------------------------------------------------------------------------------------------------ WKV-7 */

/* RWKV-7: S_t = S_{t-1} diag(e^{log_w_t}) + (S_{t-1} a_t) b_t^T + v_t k_t^T, y_t = S_t r_t.
 * r, log_w, k, v, a, b, y (B, T, H, N); state (B, H, N, N) indexed [value, key], in, overwritten with the last
 * state. A work item is a (batch, head) pair, whose time it walks. A head's outputs and state are NaN from its
 * first non-finite log_w, k, v, a, b or state entry on; r enters y_t alone, by products and sums, which carry a
 * NaN in it to y_t and no further. For the backward (ckpt not NULL): the state before every ck-th token, ckpt
 * (B H, ceil(T / ck), NP, NP) as the forward keeps it (below), and bad (B H): whether the head met a non-finite
 * input.
 *
 * Whole vectors. The loops work on vectors of VEC floats written as vector variables (GCC's and Clang's vector
 * extensions): the sums over a head's rows then stay in registers. Written as loops over arrays, the compiler kept
 * them in memory, every multiply-add of a sum waiting on the store and load of the one before (2x-3x slower
 * measured). A head of N floats is padded to NP = VEC ceil(N / VEC): the padding holds zeros (r, k, v, a, b, dy,
 * the state) and decays of 1, under which it stays zero and adds nothing; N = 32 and 64 need none. Where one sum
 * has few vectors (V = NP / VEC < CHAINS), it is split into CHAINS / V partial sums: eight independent chains of
 * multiply-adds, enough to cover each one's latency.
 *
 * The forward keeps the state transposed, St[key][value], so that each product is a sum of rows scaled by numbers,
 * with a vector of independent sums over the values instead of a sum across each row:
 *     sa = sum_j a_j St[j],   St[j] = e^{log_w_j} St[j] + b_j sa + k_j v,   y = sum_j r_j St[j].
 * The inputs of a head are a row of H N numbers apart from one token to the next, which the hardware prefetcher
 * does not follow, so the loop asks for them PREFETCH tokens ahead. */
#define CHAINS 8
#define MAX_V 16      /* vectors per row at most: head sizes up to 256 (kernels/wkv7.py sends larger ones to torch) */
#define PREFETCH 2

/* Two vectors' lanes picked by constant indices (0-15 the first's, 16-31 the second's): Clang's builtin, which GCC
 * has from version 12 on; GCC's own before. */
#if defined(__clang__) || __GNUC__ >= 12
#define PICK(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define PICK(a, b, ...) __builtin_shuffle(a, b, (vint){__VA_ARGS__})
#endif

/* The sums of 16 vectors' lanes at once, lane l of the result the sum of row l's, where x[bit_reversed[l]] holds
 * row l; x is overwritten. Each level adds pairs of vectors' halves, two rows' halves in one vector: 15 pairs of
 * shuffles and additions for 16 rows, where a tree of halves per row takes 64 of each. Level by level a vector
 * holds twice as many rows, interleaved from its pair: after four, lane l holds the row whose index is l with its
 * four bits reversed, hence the rows' places in x. */
_Static_assert(VEC == 16, "sum_lanes is written for 16 lanes");
static const int32_t bit_reversed[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

static inline __attribute__((always_inline)) vfloat sum_lanes(vfloat *x)
{
    for (int64_t p = 0; p < 8; p++) {     /* the low half of each row's lanes plus the high half */
        const vfloat a = x[2 * p], b = x[2 * p + 1];
        x[p] = PICK(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
               + PICK(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    }
    for (int64_t p = 0; p < 4; p++) {
        const vfloat a = x[2 * p], b = x[2 * p + 1];
        x[p] = PICK(a, b, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27)
               + PICK(a, b, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    }
    for (int64_t p = 0; p < 2; p++) {
        const vfloat a = x[2 * p], b = x[2 * p + 1];
        x[p] = PICK(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29)
               + PICK(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    }
    return PICK(x[0], x[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30)
           + PICK(x[0], x[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
}

/* x (N floats) as NP floats: x itself, or a copy into buf padded with fill */
static inline __attribute__((always_inline)) const float *padded(const float *x, int64_t N, int64_t NP, float fill,
                                                                 float *buf)
{
    if (N == NP)
        return x;
    memcpy(buf, x, N * sizeof(float));
    for (int64_t i = N; i < NP; i++)
        buf[i] = fill;
    return buf;
}

/* One token's inputs of a head, NP floats each (padded), w = e^{log_w}; bad: whether log_w, k, v, a or b holds a
 * non-finite number other than a log_w of -inf, a decay of 0 (e^-87 here, as the other backends' most negative
 * finite log_w: kernels/wkv7.py hands log_w to the loop as it came, saving two passes over it each way). */
struct wkv7_token {
    const float *r, *k, *v, *a, *b;
    float *w;
    int32_t bad;
};

/* NP floats of scratch for each of r, k, v, a, b, dy (copies where padded) and w */
#define WKV7_PAD_BUFFERS 7

static inline __attribute__((always_inline)) void wkv7_load(int64_t N, int64_t NP, int64_t off, const float *r,
                                                            const float *log_w, const float *k, const float *v,
                                                            const float *a, const float *b, float *pad,
                                                            struct wkv7_token *x)
{
    int32_t bad = 0;
    x->w = pad + 6 * NP;
    #pragma omp simd reduction(|:bad)
    for (int64_t j = 0; j < N; j++) {
        x->w[j] = exp_clamped(log_w[off + j]);
        bad |= nan_or_plus_inf(log_w[off + j]) | nonfinite(k[off + j]) | nonfinite(v[off + j]) | nonfinite(a[off + j])
               | nonfinite(b[off + j]);
    }
    for (int64_t j = N; j < NP; j++)
        x->w[j] = 1.0f;
    x->bad = bad;
    x->r = padded(r + off, N, NP, 0.0f, pad);
    x->k = padded(k + off, N, NP, 0.0f, pad + NP);
    x->v = padded(v + off, N, NP, 0.0f, pad + 2 * NP);
    x->a = padded(a + off, N, NP, 0.0f, pad + 3 * NP);
    x->b = padded(b + off, N, NP, 0.0f, pad + 4 * NP);
}

/* sum over the CHAINS / V partial sums acc[p V + c] into out[c], c < V */
static inline __attribute__((always_inline)) void gather_partials(int64_t V, int64_t P, const vfloat *acc, vfloat *out)
{
    #pragma GCC unroll 16
    for (int64_t c = 0; c < V; c++) {
        out[c] = acc[c];
        #pragma GCC unroll 8
        for (int64_t p = 1; p < P; p++)
            out[c] += acc[p * V + c];
    }
}

/* One step on St (transposed, NP x NP), y_t = S_t r_t into out (NP floats). */
static inline __attribute__((always_inline)) void wkv7_step(int64_t NP, float *St, const struct wkv7_token *x,
                                                            float *out)
{
    const int64_t V = NP / VEC, P = V < CHAINS ? CHAINS / V : 1, A = V * P;
    vfloat acc[MAX_V > CHAINS ? MAX_V : CHAINS], sa[MAX_V], v[MAX_V], y[MAX_V];
    #pragma GCC unroll 16
    for (int64_t c = 0; c < A; c++)
        acc[c] = (vfloat){0};
    for (int64_t j = 0; j < NP; j += P)                                /* sa = S_{t-1} a_t */
        #pragma GCC unroll 8
        for (int64_t p = 0; p < P; p++)
            #pragma GCC unroll 16
            for (int64_t c = 0; c < V; c++)
                acc[p * V + c] += x->a[j + p] * LOADV(St + (j + p) * NP + c * VEC);
    gather_partials(V, P, acc, sa);
    #pragma GCC unroll 16
    for (int64_t c = 0; c < A; c++)
        acc[c] = (vfloat){0};
    #pragma GCC unroll 16
    for (int64_t c = 0; c < V; c++)
        v[c] = LOADV(x->v + c * VEC);
    for (int64_t j = 0; j < NP; j += P)                                /* S_t, and y_t = S_t r_t */
        #pragma GCC unroll 8
        for (int64_t p = 0; p < P; p++)
            #pragma GCC unroll 16
            for (int64_t c = 0; c < V; c++) {
                float *row = St + (j + p) * NP + c * VEC;
                const vfloat s = x->w[j + p] * LOADV(row) + x->b[j + p] * sa[c] + x->k[j + p] * v[c];
                STOREV(row, s);
                acc[p * V + c] += x->r[j + p] * s;
            }
    gather_partials(V, P, acc, y);
    #pragma GCC unroll 16
    for (int64_t c = 0; c < V; c++)
        STOREV(out + c * VEC, y[c]);
}

static inline __attribute__((always_inline)) void wkv7_item(
    int64_t item, int64_t T, int64_t H, int64_t N, int64_t NP, const float *r, const float *log_w, const float *k,
    const float *v, const float *a, const float *b, float *y, float *state, float *St, float *pad, int64_t ck,
    float *ckpt, int32_t *bad_out)
{
    const int64_t bi = item / H, h = item % H, n_ckpt = (T + ck - 1) / ck;
    float *S = state + item * N * N, out[MAX_V * VEC];
    struct wkv7_token x;
    int32_t bad = 0;
    memset(St, 0, NP * NP * sizeof(float));
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < N; j++) {
            St[j * NP + i] = S[i * N + j];
            bad |= nonfinite(S[i * N + j]);
        }
    for (int64_t t = 0; t < T; t++) {
        const int64_t off = ((bi * T + t) * H + h) * N;
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
        if (ckpt && t % ck == 0)
            memcpy(ckpt + (item * n_ckpt + t / ck) * NP * NP, St, NP * NP * sizeof(float));
        wkv7_load(N, NP, off, r, log_w, k, v, a, b, pad, &x);
        bad |= x.bad;
        wkv7_step(NP, St, &x, out);
        for (int64_t i = 0; i < N; i++)
            y[off + i] = poison(out[i], bad);
    }
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < N; j++)
            S[i * N + j] = poison(St[j * NP + i], bad);
    if (bad_out)
        bad_out[item] = bad;
}

/* The head size padded to whole vectors: NP, which the checkpoints take (native.py asks for it) */
int64_t wkv7_padded_size(int64_t N)
{
    return (N + VEC - 1) / VEC * VEC;
}

/* The largest head size the loops take */
int64_t wkv7_max_head_size(void)
{
    return MAX_V * VEC;
}

int wkv7_forward(int64_t first, int64_t last, int64_t T, int64_t H, int64_t N,
                 const float *r, const float *log_w, const float *k, const float *v, const float *a,
                 const float *b, float *y, float *state, int64_t ck, float *ckpt, int32_t *bad_out)
{
    if (N > MAX_V * VEC)      /* kernels/wkv7.py sends larger heads to torch */
        return STATUS_HEAD_SIZE;
    const int64_t NP = wkv7_padded_size(N);
    float *St = scratch_floats(NP * NP + WKV7_PAD_BUFFERS * NP);
    if (!St)
        return STATUS_NO_MEMORY;
    for (int64_t item = first; item < last; item++) {
        if (N == 32)        /* NP a constant: each row's vectors unrolled, in registers (1.6x-1.9x measured) */
            wkv7_item(item, T, H, 32, 32, r, log_w, k, v, a, b, y, state, St, St + 32 * 32, ck, ckpt, bad_out);
        else if (N == 64)   /* RWKV-7's head size */
            wkv7_item(item, T, H, 64, 64, r, log_w, k, v, a, b, y, state, St, St + 64 * 64, ck, ckpt, bad_out);
        else
            wkv7_item(item, T, H, N, NP, r, log_w, k, v, a, b, y, state, St, St + NP * NP, ck, ckpt, bad_out);
    }
    free(St);
    return STATUS_OK;
}

/* The backward of wkv7_forward, kernels/wkv7.py's Triton backward with G = dL/dS_t:
 *     G += dy_t r_t^T;  dr_t = S_t^T dy_t;  dv_t = G k_t;  dk_t = G^T v_t;  q = G b_t;  db_t = G^T (S_{t-1} a_t);
 *     da_t = S_{t-1}^T q;  dlog_w_t = w_t * colsum(G * S_{t-1});  G <- G diag(w_t) + q a_t^T   (= dL/dS_{t-1})
 * with dr_t = w_t (S_{t-1}^T dy_t) + b_t (sa . dy_t) + k_t (v_t . dy_t), S_t expanded as the Triton kernel does.
 * For each chunk of ck steps from the last: re-run it forward from its checkpoint, keeping S_{t-1} and
 * sa = S_{t-1} a_t of every step, then walk it back. Unlike the forward, G and the re-run states are kept
 * [value][key], as the state is: the key-vector gradients (sums over values) are then sums of rows scaled by
 * numbers, vectors of independent sums across the rows, and one pass over the rows of G and S_{t-1} does a whole
 * step, including the next step's G += dy r^T and its dot products q = G b, dv = G k (about 10% faster measured
 * than G transposed and a pass for each). dy (B, T, H, N); dstate (B, H, N, N): the cotangent of the last state.
 * Out: dr, dlog_w, dk, dv, da, db (B, T, H, N), dstate0 (B, H, N, N). A work item is a (batch, head) pair, which
 * writes its own outputs alone; a head that met a non-finite input has NaN gradients. */

/* Row i of G (V vectors, in g): G_i += dy_i r^T, then q_i = G_i . b and gv_i = G_i . k as vectors of partial sums
 * (sum_lanes adds their lanes, 16 rows at a time) */
static inline __attribute__((always_inline)) void wkv7_add_output(int64_t V, vfloat *g, float dyi,
                                                                  const struct wkv7_token *x, vfloat *qi, vfloat *gvi)
{
    vfloat q = {0}, gv = {0};
    #pragma GCC unroll 16
    for (int64_t c = 0; c < V; c++) {
        g[c] += dyi * LOADV(x->r + c * VEC);
        q += g[c] * LOADV(x->b + c * VEC);
        gv += g[c] * LOADV(x->k + c * VEC);
    }
    *qi = q;
    *gvi = gv;
}

/* The backward's start, at the last token: G = dstate (padded with zeros), then that token's G += dy r^T and its
 * q = G b, gv = G k. x: filled with the last token's inputs. */
static inline __attribute__((always_inline)) void wkv7_backward_start(
    int64_t item, int64_t T, int64_t H, int64_t N, int64_t NP, const float *r, const float *log_w, const float *k,
    const float *v, const float *a, const float *b, const float *dy, const float *dstate, float *G, float *pad,
    struct wkv7_token *x, float *q, float *gv, vfloat *q_rows, vfloat *gv_rows)
{
    const int64_t bi = item / H, h = item % H, V = NP / VEC;
    memset(G, 0, NP * NP * sizeof(float));
    for (int64_t i = 0; i < N; i++)
        memcpy(G + i * NP, dstate + (item * N + i) * N, N * sizeof(float));
    const int64_t last = ((bi * T + T - 1) * H + h) * N;
    wkv7_load(N, NP, last, r, log_w, k, v, a, b, pad, x);
    const float *dy_t = padded(dy + last, N, NP, 0.0f, pad + 5 * NP);
    for (int64_t i = 0; i < NP; i++) {
        vfloat g[MAX_V];
        for (int64_t c = 0; c < V; c++)
            g[c] = LOADV(G + i * NP + c * VEC);
        wkv7_add_output(V, g, dy_t[i], x, q_rows + bit_reversed[i % 16], gv_rows + bit_reversed[i % 16]);
        for (int64_t c = 0; c < V; c++)
            STOREV(G + i * NP + c * VEC, g[c]);
        if (i % 16 == 15) {
            STOREV(q + i - 15, sum_lanes(q_rows));
            STOREV(gv + i - 15, sum_lanes(gv_rows));
        }
    }
}

/* A chunk of L steps from t0 re-run forward from its checkpoint St (the forward's layout, [key][value]): history[l]
 * = S_{t-1} ([value][key]) and sas[l] = S_{t-1} a_t, t = t0 + l (history[0] is the checkpoint transposed). */
static inline __attribute__((always_inline)) void wkv7_chunk_rerun(
    int64_t item, int64_t T, int64_t H, int64_t N, int64_t NP, int64_t t0, int64_t L, const float *St,
    const float *r, const float *log_w, const float *k, const float *v, const float *a, const float *b, float *pad,
    struct wkv7_token *x, float *history, float *sas)
{
    const int64_t bi = item / H, h = item % H, V = NP / VEC;
    vfloat sa_rows[16];                                    /* 16 rows' partial sums, for sum_lanes */
    for (int64_t i = 0; i < NP; i++)
        for (int64_t j = 0; j < NP; j++)
            history[i * NP + j] = St[j * NP + i];
    for (int64_t l = 0; l < L; l++) {        /* history[l] = S_{t-1}, sas[l] = S_{t-1} a_t, t = t0 + l */
        const float *S = history + l * NP * NP;
        float *next = history + (l + 1) * NP * NP;
        wkv7_load(N, NP, ((bi * T + t0 + l) * H + h) * N, r, log_w, k, v, a, b, pad, x);
        float *sa = sas + l * NP;
        for (int64_t i = 0; i < NP; i++) {
            vfloat dot = {0};
            #pragma GCC unroll 16
            for (int64_t c = 0; c < V; c++)
                dot += LOADV(S + i * NP + c * VEC) * LOADV(x->a + c * VEC);
            sa_rows[bit_reversed[i % 16]] = dot;
            if (i % 16 == 15)
                STOREV(sa + i - 15, sum_lanes(sa_rows));
        }
        if (l + 1 < L)
            for (int64_t i = 0; i < NP; i++)
                #pragma GCC unroll 16
                for (int64_t c = 0; c < V; c++)
                    STOREV(next + i * NP + c * VEC, LOADV(x->w + c * VEC) * LOADV(S + i * NP + c * VEC)
                           + sa[i] * LOADV(x->b + c * VEC) + x->v[i] * LOADV(x->k + c * VEC));
    }
}

/* Step t's pass over the rows of G and S = S_{t-1}: the vector sums gs = colsum(G * S), g_v = G^T v,
 * g_sa = G^T sa, s_q = S^T q, s_dy = S^T dy (zeroed here), G <- G diag(w_t) + q a_t^T; and for t > 0, while the
 * row is at hand, the step before's G += dy r^T and its q = G b, gv = G k (x: step t's inputs, before: step
 * t - 1's). */
static inline __attribute__((always_inline)) void wkv7_backward_rows(
    int64_t t, int64_t NP, const float *S, const float *sa, const float *dy_t, const float *dy_before,
    const struct wkv7_token *x, const struct wkv7_token *before, float *G, float *q, float *gv, vfloat *q_rows,
    vfloat *gv_rows, vfloat *gs, vfloat *g_v, vfloat *g_sa, vfloat *s_q, vfloat *s_dy)
{
    const int64_t V = NP / VEC;
    #pragma GCC unroll 16
    for (int64_t c = 0; c < V; c++)
        gs[c] = g_v[c] = g_sa[c] = s_q[c] = s_dy[c] = (vfloat){0};
    for (int64_t i = 0; i < NP; i++) {
        const float qi = q[i], vi = x->v[i], sai = sa[i], dyi = dy_t[i];
        vfloat g[MAX_V];
        #pragma GCC unroll 16
        for (int64_t c = 0; c < V; c++) {
            const vfloat Si = LOADV(S + i * NP + c * VEC);
            g[c] = LOADV(G + i * NP + c * VEC);
            gs[c] += g[c] * Si;
            g_v[c] += g[c] * vi;
            g_sa[c] += g[c] * sai;
            s_q[c] += Si * qi;
            s_dy[c] += Si * dyi;
            g[c] = LOADV(x->w + c * VEC) * g[c] + qi * LOADV(x->a + c * VEC);
        }
        #pragma GCC unroll 16
        for (int64_t c = 0; c < V; c++)
            STOREV(G + i * NP + c * VEC, g[c]);
        if (t == 0)
            continue;
        /* the step before's G += dy r^T, q = G b, gv = G k, while the row is at hand */
        wkv7_add_output(V, g, dy_before[i], before, q_rows + bit_reversed[i % 16], gv_rows + bit_reversed[i % 16]);
        #pragma GCC unroll 16
        for (int64_t c = 0; c < V; c++)
            STOREV(G + i * NP + c * VEC, g[c]);
        if (i % 16 == 15) {
            STOREV(q + i - 15, sum_lanes(q_rows));
            STOREV(gv + i - 15, sum_lanes(gv_rows));
        }
    }
}

/* One step back, token t at offset off: dv_t = gv (the previous pass's G k), the rows' pass, then dr_t (expanded
 * as above), dlog_w_t, dk_t, da_t, db_t, NaN for a head that met a non-finite input (bad). */
static inline __attribute__((always_inline)) void wkv7_backward_token(
    int64_t t, int64_t off, int64_t H, int64_t N, int64_t NP, int32_t bad, const float *r, const float *log_w,
    const float *k, const float *v, const float *a, const float *b, const float *dy, const float *S,
    const float *sa, float *pad, float *pad_before, struct wkv7_token *x, struct wkv7_token *before, float *G,
    float *q, float *gv, vfloat *q_rows, vfloat *gv_rows, float *dr, float *dlog_w, float *dk, float *dv,
    float *da, float *db)
{
    const int64_t V = NP / VEC;
    wkv7_load(N, NP, off, r, log_w, k, v, a, b, pad, x);
    const float *dy_t = padded(dy + off, N, NP, 0.0f, pad + 5 * NP);
    if (t > 0)
        wkv7_load(N, NP, off - H * N, r, log_w, k, v, a, b, pad_before, before);
    const float *dy_before = t > 0 ? padded(dy + off - H * N, N, NP, 0.0f, pad_before + 5 * NP) : NULL;
    float sa_dy = 0.0f, v_dy = 0.0f;
    for (int64_t i = 0; i < N; i++) {
        sa_dy += sa[i] * dy_t[i];
        v_dy += x->v[i] * dy_t[i];
        dv[off + i] = poison(gv[i], bad);
    }
    vfloat gs[MAX_V], g_v[MAX_V], g_sa[MAX_V], s_q[MAX_V], s_dy[MAX_V];
    wkv7_backward_rows(t, NP, S, sa, dy_t, dy_before, x, before, G, q, gv, q_rows, gv_rows, gs, g_v, g_sa, s_q,
                       s_dy);
    float out[5][MAX_V * VEC];
    #pragma GCC unroll 16
    for (int64_t c = 0; c < V; c++) {
        const vfloat w = LOADV(x->w + c * VEC);
        STOREV(out[0] + c * VEC, w * s_dy[c] + sa_dy * LOADV(x->b + c * VEC) + v_dy * LOADV(x->k + c * VEC));
        STOREV(out[1] + c * VEC, w * gs[c]);
        STOREV(out[2] + c * VEC, g_v[c]);
        STOREV(out[3] + c * VEC, s_q[c]);
        STOREV(out[4] + c * VEC, g_sa[c]);
    }
    for (int64_t j = 0; j < N; j++) {
        dr[off + j] = poison(out[0][j], bad);
        dlog_w[off + j] = poison(out[1][j], bad);
        dk[off + j] = poison(out[2][j], bad);
        da[off + j] = poison(out[3][j], bad);
        db[off + j] = poison(out[4][j], bad);
    }
}

static inline __attribute__((always_inline)) void wkv7_backward_item(
    int64_t item, int64_t T, int64_t H, int64_t N, int64_t NP, const float *r, const float *log_w, const float *k,
    const float *v, const float *a, const float *b, const float *dy, const float *dstate, int64_t ck,
    const float *ckpt, const int32_t *bad_in, float *dr, float *dlog_w, float *dk, float *dv, float *da, float *db,
    float *dstate0, float *G, float *history, float *sas, float *pad)
{
    const int64_t bi = item / H, h = item % H, n_ckpt = (T + ck - 1) / ck;
    const int32_t bad = bad_in[item];
    float q[MAX_V * VEC], gv[MAX_V * VEC];
    vfloat q_rows[16], gv_rows[16];                        /* 16 rows' partial sums, for sum_lanes */
    struct wkv7_token x = {0}, before = {0};                                /* step t's inputs, and step t - 1's */
    float *pad_before = pad + WKV7_PAD_BUFFERS * NP;
    wkv7_backward_start(item, T, H, N, NP, r, log_w, k, v, a, b, dy, dstate, G, pad, &x, q, gv, q_rows, gv_rows);
    for (int64_t chunk = n_ckpt - 1; chunk >= 0; chunk--) {
        const int64_t t0 = chunk * ck, L = T - t0 < ck ? T - t0 : ck;
        wkv7_chunk_rerun(item, T, H, N, NP, t0, L, ckpt + (item * n_ckpt + chunk) * NP * NP, r, log_w, k, v, a, b,
                         pad, &x, history, sas);
        for (int64_t l = L - 1; l >= 0; l--) {
            const int64_t t = t0 + l;
            wkv7_backward_token(t, ((bi * T + t) * H + h) * N, H, N, NP, bad, r, log_w, k, v, a, b, dy,
                                history + l * NP * NP, sas + l * NP, pad, pad_before, &x, &before, G, q, gv, q_rows,
                                gv_rows, dr, dlog_w, dk, dv, da, db);
        }
    }
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < N; j++)
            dstate0[(item * N + i) * N + j] = poison(G[i * NP + j], bad);
}

int wkv7_backward(int64_t first, int64_t last, int64_t T, int64_t H, int64_t N,
                   const float *r, const float *log_w, const float *k, const float *v, const float *a,
                   const float *b, const float *dy, const float *dstate, int64_t ck, const float *ckpt,
                   const int32_t *bad, float *dr, float *dlog_w, float *dk, float *dv, float *da, float *db,
                   float *dstate0)
{
    if (N > MAX_V * VEC)      /* kernels/wkv7.py sends larger heads to torch */
        return STATUS_HEAD_SIZE;
    const int64_t NP = wkv7_padded_size(N);
    /* G, the re-run states and the rest, each VEC floats off the one before: G's rows would otherwise lie a
     * multiple of 4 KiB from the states' rows read beside them, and the loads wait on the stores (4K aliasing:
     * 10 -> 7.5 ms measured) */
    float *G = scratch_floats((ck + 2) * NP * NP + ck * NP + 2 * WKV7_PAD_BUFFERS * NP + 2 * VEC);
    if (!G)
        return STATUS_NO_MEMORY;
    float *history = G + NP * NP + VEC, *sas = history + (ck + 1) * NP * NP + VEC, *pad = sas + ck * NP;
    for (int64_t item = first; item < last; item++) {
        if (N == 32)
            wkv7_backward_item(item, T, H, 32, 32, r, log_w, k, v, a, b, dy, dstate, ck, ckpt, bad, dr, dlog_w, dk,
                               dv, da, db, dstate0, G, history, sas, pad);
        else if (N == 64)
            wkv7_backward_item(item, T, H, 64, 64, r, log_w, k, v, a, b, dy, dstate, ck, ckpt, bad, dr, dlog_w, dk,
                               dv, da, db, dstate0, G, history, sas, pad);
        else
            wkv7_backward_item(item, T, H, N, NP, r, log_w, k, v, a, b, dy, dstate, ck, ckpt, bad, dr, dlog_w, dk,
                               dv, da, db, dstate0, G, history, sas, pad);
    }
    free(G);
    return STATUS_OK;
}
