/* RWKV-4's WKV as a plain C loop, forward and backward (fp32): the op's backend="c", bound by kernels/wkv4/c.py.
 * What every op's loops share (the vectorizable e^x and softplus, the vector types, the status codes, the
 * scratch buffers) is in kernels/native.h; kernels/native.c says why the loops are C and how they are built. */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native.h"
#include "wkv4.h"

/* RWKV-4's WKV, the max-tracked recurrence of kernels/wkv4/__init__.py's Triton forward (same formulas, same order):
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

/* The backward of wkv4_forward, kernels/wkv4/__init__.py's Triton backward (same formulas, same names): time in reverse with
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
