/* Mamba's selective scan as a plain C loop, forward and backward (fp32): the op's backend="c", bound by kernels/ssm/c.py.
 * What every op's loops share (the vectorizable e^x and softplus, the vector types, the status codes, the
 * scratch buffers) is in kernels/native.h; kernels/native.c says why the loops are C and how they are built. */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native.h"
#include "ssm.h"

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
                                               other backends take it: kernels/ssm/ hands A over as it came) */
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

/* The backward of selective_scan_forward, the formulas of kernels/ssm/__init__.py's Triton backward plus the elementwise
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
